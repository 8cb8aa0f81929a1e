package algorithm

import "slices"

// DedupeLog remembers the decisions taken for the evaluation ids
// (RecordID) of one subject and policy, oldest first, each until it
// expires: the store looks a decision's id up (Lookup) and hands what it
// finds to Evaluate as Evaluation.Replay, and remembers a decision it
// commits or denies (Remember). Most logs hold one id or a few: they are
// found by a scan, and only a log past indexFrom records keeps an index (a
// map of its own costs hundreds of bytes even for one id). The zero value
// is an empty log; a DedupeLog is not safe for concurrent use.
// redisstore's dedupe.lua ports it, in a sorted set (id → expiry) and a
// hash (id → decisions) instead of the slice and the index.
type DedupeLog struct {
	order []dedupeRecord         // in the order recorded; expiries ascend with it
	index map[string]dedupeEntry // nil up to indexFrom records
	head  int                    // records forgotten from the front since the index was built
	// extras holds the Extra and Others of the estimates' and settles'
	// records (Record) by id, nil until one is remembered: apart, so that
	// every other record keeps its size.
	extras map[string]recordExtra
}

// recordExtra is what a record of an estimate or a settle holds beside
// its decisions.
type recordExtra struct {
	ints   []int64
	others string
}

// indexFrom is the size from which a DedupeLog indexes its ids.
const indexFrom = 8

type dedupeRecord struct {
	id        string
	expires   int64 // µs
	decisions []Decision
}

// dedupeEntry is a record's place in order, counted from when the index
// was built (minus head for the current position).
type dedupeEntry struct{ at int }

// LookupRecord returns the record remembered for id, Extra included, or
// false when there is none or it expired (at or before now).
func (l *DedupeLog) LookupRecord(id string, now int64) (Record, bool) {
	if r, ok := l.get(id); ok && r.expires > now {
		x := l.extras[id]
		return Record{Decisions: r.decisions, Extra: x.ints, Others: x.others}, true
	}
	return Record{}, false
}

// Lookup returns the decisions remembered for id, or nil when there are
// none or they expired (at or before now): LookupRecord's, without the
// record's Extra.
func (l *DedupeLog) Lookup(id string, now int64) []Decision {
	r, _ := l.LookupRecord(id, now)
	return r.Decisions
}

// Remember records a copy of ds for id until now + ttl, forgetting
// expired ids and, beyond max, the oldest, and returns by how many
// records the log grew (negative: it shrank). An id still live would have
// been replayed: id is new or expired.
func (l *DedupeLog) Remember(id string, now, ttl int64, max int, ds []Decision) int {
	grew := -l.Prune(now, max)
	if _, stale := l.get(id); stale {
		// Expired but behind a longer-lived record (the TTL changed).
		l.remove(id)
		grew--
	}
	l.add(dedupeRecord{id: id, expires: now + ttl, decisions: slices.Clone(ds)})
	return grew + 1 - l.Prune(now, max)
}

// RememberRecord is Remember, with a copy of extra and others kept
// beside ds (Record.Extra, Record.Others).
func (l *DedupeLog) RememberRecord(id string, now, ttl int64, max int, ds []Decision, extra []int64, others string) int {
	grew := l.Remember(id, now, ttl, max, ds)
	if _, ok := l.get(id); ok && (len(extra) > 0 || others != "") {
		if l.extras == nil {
			l.extras = make(map[string]recordExtra)
		}
		l.extras[id] = recordExtra{ints: slices.Clone(extra), others: others}
	}
	return grew
}

// Prune forgets expired records, and the oldest beyond max, and returns
// how many it forgot.
func (l *DedupeLog) Prune(now int64, max int) int {
	drop := 0
	for drop < len(l.order) && (l.order[drop].expires <= now || len(l.order)-drop > max) {
		if l.index != nil {
			delete(l.index, l.order[drop].id)
		}
		if l.extras != nil {
			delete(l.extras, l.order[drop].id)
		}
		l.order[drop] = dedupeRecord{}
		drop++
	}
	if drop == 0 {
		return 0
	}
	l.order = l.order[drop:]
	l.head += drop
	if len(l.order) <= indexFrom/2 && l.index != nil || cap(l.order) > 2*len(l.order)+indexFrom {
		// Small again, or mostly forgotten room: copy what is left to a
		// slice of its own so the forgotten front can be collected.
		l.order = slices.Clip(slices.Clone(l.order))
		l.reindex()
	}
	return drop
}

// Len returns how many records the log holds, expired ones not yet
// pruned included.
func (l *DedupeLog) Len() int { return len(l.order) }

// Newest returns the expiry of the most recent record, or 0.
func (l *DedupeLog) Newest() int64 {
	if len(l.order) == 0 {
		return 0
	}
	return l.order[len(l.order)-1].expires
}

// get returns the record of id.
func (l *DedupeLog) get(id string) (*dedupeRecord, bool) {
	if l.index != nil {
		e, ok := l.index[id]
		if !ok {
			return nil, false
		}
		return &l.order[e.at-l.head], true
	}
	for i := range l.order {
		if l.order[i].id == id {
			return &l.order[i], true
		}
	}
	return nil, false
}

// add appends r, a record of an id the log does not hold.
func (l *DedupeLog) add(r dedupeRecord) {
	l.order = append(l.order, r)
	switch {
	case l.index != nil:
		l.index[r.id] = dedupeEntry{len(l.order) - 1 + l.head}
	case len(l.order) > indexFrom:
		l.reindex()
	}
}

// reindex builds the index anew, or drops it when the log is small.
func (l *DedupeLog) reindex() {
	l.head = 0
	if len(l.order) <= indexFrom {
		l.index = nil
		return
	}
	l.index = make(map[string]dedupeEntry, len(l.order))
	for i := range l.order {
		l.index[l.order[i].id] = dedupeEntry{i}
	}
}

// remove forgets id wherever it is in the log.
func (l *DedupeLog) remove(id string) {
	delete(l.extras, id)
	l.order = slices.DeleteFunc(l.order, func(r dedupeRecord) bool { return r.id == id })
	l.reindex()
}
