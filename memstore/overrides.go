package memstore

import (
	"context"
	"fmt"
	"sort"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/overridemap"
)

// The methods a Limiter looks for to keep overrides in its Store (see
// sluice.Limiter.SetOverride).
var _ interface {
	PutOverride(context.Context, sluice.Override) error
	Overrides(context.Context) ([]sluice.Override, error)
} = (*Store)(nil)

// PutOverride keeps overrides for sluice.Limiter: the override lives in the
// process, for every Limiter on s. Past Options.MaxOverrides a new one is
// refused. Limiter.SetOverride validates it.
func (s *Store) PutOverride(ctx context.Context, o sluice.Override) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.ovrMu.Lock()
	defer s.ovrMu.Unlock()
	k := [2]string{o.Policy, o.Subject}
	if o.Limit == 0 {
		delete(s.ovr, k)
		return nil
	}
	if s.ovr == nil {
		s.ovr = make(map[[2]string]sluice.Override)
	}
	if _, ok := s.ovr[k]; !ok && s.maxOvr > 0 && len(s.ovr) >= s.maxOvr {
		return fmt.Errorf("memstore: PutOverride: %w", &overridemap.Full{Stored: len(s.ovr), Max: s.maxOvr})
	}
	s.ovr[k] = o
	return nil
}

// Overrides keeps overrides for sluice.Limiter: every override put, by
// policy then subject.
func (s *Store) Overrides(ctx context.Context) ([]sluice.Override, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.ovrMu.Lock()
	list := make([]sluice.Override, 0, len(s.ovr))
	for _, o := range s.ovr {
		list = append(list, o)
	}
	s.ovrMu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		return a.Policy < b.Policy || a.Policy == b.Policy && a.Subject < b.Subject
	})
	return list, nil
}
