package redisstore

import (
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice"
)

// spread hands each decision of batch its part of c's reply: its own
// reply or error reply, or c's error when the call failed as a whole. A
// decision by spec admitted with no retry has two integers there,
// remaining and resetAfter: they are kept in the decision (whole, at,
// compact), for send to make its reply whole with its limit and the time
// the call decided at, the reply's first value, without a reply of
// values boxed for cmd.
func spread(c scriptCmd, batch []*pending) {
	replies, err := c.Slice()
	var at int64
	if err == nil {
		at, err = spreadTime(replies, len(batch))
	}
	k := 1
	for _, p := range batch {
		switch {
		case err == nil && k >= len(replies):
			err = fmt.Errorf("redisstore: decideAll answered %d values, too few for %d decisions: %w", len(replies), len(batch), sluice.ErrIndeterminate)
		case err != nil:
		case p.spec != "" && isInt(replies[k]) && k+1 < len(replies) && isInt(replies[k+1]):
			p.whole, p.at, p.compact = [2]int64{replies[k].(int64), replies[k+1].(int64)}, at, true
			k += 2
			continue
		default:
			if rerr, ok := replies[k].(error); ok {
				p.command().SetErr(rerr) // the decision's own error reply (SLUICE_CORRUPT, …)
			} else {
				p.command().SetVal(replies[k])
			}
			k++
			continue
		}
		p.command().SetErr(err)
	}
	if err == nil && k != len(replies) {
		// Too many values: the replies handed out may be misplaced too.
		err = fmt.Errorf("redisstore: decideAll answered %d values, more than %d decisions take: %w", len(replies), len(batch), sluice.ErrIndeterminate)
		for _, p := range batch {
			p.command().SetErr(err)
		}
	}
}

// spreadTime returns the first value of a decideAll reply for n
// decisions: the time they were decided at on Redis time, or 0.
func spreadTime(replies []any, n int) (int64, error) {
	if len(replies) < 1+n {
		return 0, fmt.Errorf("redisstore: decideAll answered %d values for %d decisions: %w", len(replies), n, sluice.ErrIndeterminate)
	}
	at, ok := replies[0].(int64)
	if !ok {
		return 0, fmt.Errorf("redisstore: decideAll answered %v first, not the time: %w", replies[0], sluice.ErrIndeterminate)
	}
	return at, nil
}

// isInt reports whether v, a value of a reply, is an integer.
func isInt(v any) bool {
	_, ok := v.(int64)
	return ok
}

// values appends the integers of p's reply to dst: its compact reply
// made whole (its limit, and the time its decideAll call decided at), or
// its command's.
func (p *pending) values(dst []int64) ([]int64, error) {
	if p.compact {
		return append(dst, 0, 1, p.limit, p.whole[0], p.whole[1], 0, p.at), nil
	}
	return int64s(p.command(), dst)
}

// int64s appends the integers of cmd's reply to dst, as Int64Slice reads
// them, without a slice of its own.
func int64s(cmd scriptCmd, dst []int64) ([]int64, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	for _, v := range vals {
		switch v := v.(type) {
		case int64:
			dst = append(dst, v)
		case string:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, err
			}
			dst = append(dst, n)
		default:
			return nil, fmt.Errorf("redis: unexpected element type for Int64Slice, got type %T", v)
		}
	}
	return dst, nil
}
