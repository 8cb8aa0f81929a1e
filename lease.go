package sluice

// leaseOf returns the lease an allowed Acquire or Renew of ev holds: on
// its Concurrency policies.
func leaseOf(ev *Evaluation) Lease {
	lease := Lease{ID: ev.LeaseID, Subject: ev.Subject}
	for _, p := range ev.Policies {
		if p.Algorithm == Concurrency {
			lease.Policies = append(lease.Policies, p.ID)
		}
	}
	return lease
}
