package overridemap

import "hash/maphash"

// Key names one override: a policy ID and a subject.
type Key struct{ Policy, Subject string }

// Map is an immutable map from Key to V: a persistent hash trie. With and
// Without return a new Map that shares all but the path to the key's
// leaf with the old one, so one override set among 10 000 copies a few
// nodes instead of the whole map, and a snapshot in use by a Check is
// never changed under it. The zero Map is not usable: make one with
// Build. Safe for concurrent use (nothing in it changes).
type Map[V any] struct {
	seed maphash.Seed
	root *node[V]
	n    int
}

// fanout is the children of an inner node: 5 bits of the hash a level.
const (
	bits    = 5
	fanout  = 1 << bits
	leafMax = 8 // entries a leaf holds before it splits, while hash bits remain
)

// node is an inner node (kids set) or a leaf (items).
type node[V any] struct {
	kids  *[fanout]*node[V]
	items []item[V]
}

type item[V any] struct {
	hash uint64
	key  Key
	val  V
}

// Build returns a Map of items, the last of a key winning.
func Build[V any](seed maphash.Seed, keys []Key, vals []V) *Map[V] {
	m := &Map[V]{seed: seed}
	at := make(map[Key]int, len(keys))
	items := make([]item[V], 0, len(keys))
	for i, k := range keys {
		if j, dup := at[k]; dup {
			items[j].val = vals[i]
			continue
		}
		at[k] = len(items)
		items = append(items, item[V]{hash: m.hash(k), key: k, val: vals[i]})
	}
	m.n = len(items)
	if len(items) > 0 {
		m.root = split(items, 0)
	}
	return m
}

func (m *Map[V]) hash(k Key) uint64 { return maphash.Comparable(m.seed, k) }

// Len returns the number of keys in m.
func (m *Map[V]) Len() int { return m.n }

// Get returns the value of k.
func (m *Map[V]) Get(k Key) (V, bool) {
	h := m.hash(k)
	n := m.root
	for shift := uint(0); n != nil && n.kids != nil; shift += bits {
		n = n.kids[(h>>shift)%fanout]
	}
	if n != nil {
		for i := range n.items {
			if it := &n.items[i]; it.hash == h && it.key == k {
				return it.val, true
			}
		}
	}
	var zero V
	return zero, false
}

// With returns m with k set to v.
func (m *Map[V]) With(k Key, v V) *Map[V] {
	root, added := with(m.root, 0, item[V]{hash: m.hash(k), key: k, val: v})
	out := &Map[V]{seed: m.seed, root: root, n: m.n}
	if added {
		out.n++
	}
	return out
}

// Without returns m without k.
func (m *Map[V]) Without(k Key) *Map[V] {
	root, removed := without(m.root, 0, m.hash(k), k)
	if !removed {
		return m
	}
	return &Map[V]{seed: m.seed, root: root, n: m.n - 1}
}

// Range calls f for every key of m and its value, in no order.
func (m *Map[V]) Range(f func(Key, V)) {
	var walk func(n *node[V])
	walk = func(n *node[V]) {
		if n == nil {
			return
		}
		if n.kids != nil {
			for _, k := range n.kids {
				walk(k)
			}
			return
		}
		for _, it := range n.items {
			f(it.key, it.val)
		}
	}
	walk(m.root)
}

// split returns a node holding items, whose hashes agree below shift:
// a leaf while they fit in one (or no hash bits remain), else an inner
// node over their next bits.
func split[V any](items []item[V], shift uint) *node[V] {
	if len(items) <= leafMax || shift >= 64 {
		return &node[V]{items: items}
	}
	var groups [fanout][]item[V]
	for _, it := range items {
		i := (it.hash >> shift) % fanout
		groups[i] = append(groups[i], it)
	}
	n := &node[V]{kids: new([fanout]*node[V])}
	for i, g := range groups {
		if len(g) > 0 {
			n.kids[i] = split(g, shift+bits)
		}
	}
	return n
}

// with returns n (at shift) with it set, copying the path to its leaf,
// and whether its key is new.
func with[V any](n *node[V], shift uint, it item[V]) (*node[V], bool) {
	if n == nil {
		return &node[V]{items: []item[V]{it}}, true
	}
	if n.kids != nil {
		i := (it.hash >> shift) % fanout
		kid, added := with(n.kids[i], shift+bits, it)
		kids := *n.kids
		kids[i] = kid
		return &node[V]{kids: &kids}, added
	}
	items := make([]item[V], len(n.items), len(n.items)+1)
	copy(items, n.items)
	for i := range items {
		if items[i].hash == it.hash && items[i].key == it.key {
			items[i] = it
			return &node[V]{items: items}, false
		}
	}
	return split(append(items, it), shift), true
}

// without returns n (at shift) without key k of hash h, copying the path
// to its leaf (nil for a leaf left empty), and whether k was there.
func without[V any](n *node[V], shift uint, h uint64, k Key) (*node[V], bool) {
	if n == nil {
		return nil, false
	}
	if n.kids != nil {
		i := (h >> shift) % fanout
		kid, removed := without(n.kids[i], shift+bits, h, k)
		if !removed {
			return n, false
		}
		kids := *n.kids
		kids[i] = kid
		return &node[V]{kids: &kids}, true
	}
	for i := range n.items {
		if n.items[i].hash == h && n.items[i].key == k {
			if len(n.items) == 1 {
				return nil, true
			}
			items := make([]item[V], 0, len(n.items)-1)
			items = append(append(items, n.items[:i]...), n.items[i+1:]...)
			return &node[V]{items: items}, true
		}
	}
	return n, false
}
