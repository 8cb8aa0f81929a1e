package sluiceclient

// Queued returns how many checks wait in c's queue for a sender: the
// tests wait until every caller they started is either there or at the
// server.
func Queued(c *Client) int {
	if c.co == nil {
		return 0 // NoCoalescing
	}
	c.co.mu.Lock()
	defer c.co.mu.Unlock()
	return len(c.co.queue)
}
