package checkapi

// RLQSPath lists the buckets of Envoy's quota service on this server
// (RLQSList); ?limit= caps how many, 1 to RLQSMaxLimit (default
// RLQSDefaultLimit).
const RLQSPath = "/v1/rlqs"

// The bounds of GET /v1/rlqs's limit.
const (
	RLQSDefaultLimit = 100
	RLQSMaxLimit     = 1000
)

// RLQSList is the answer of GET /v1/rlqs: the buckets by domain then
// subject, at most the limit asked; Error says why a request was refused.
type RLQSList struct {
	Buckets []RLQSBucketView `json:"buckets"`
	// Truncated is true when the server holds more buckets than listed.
	Truncated bool   `json:"truncated"`
	Error     string `json:"error,omitempty"`
}

// RLQSBucketView is one bucket of Envoy's quota service as this server
// holds it: never its bucket id, only its subject (the pseudonym a plan
// names).
type RLQSBucketView struct {
	Domain string `json:"domain"`
	// Policy is its matcher's policy. Example: "per-tenant".
	Policy  string `json:"policy"`
	Subject string `json:"subject"`
	// Streams is how many of this server's Envoy streams report it.
	Streams int `json:"streams"`
	// Demand is their smoothed demand, requests per second. Example: 12.5.
	Demand float64 `json:"demand"`
	// Rate and Burst are what they are assigned together, tokens per
	// second and tokens. Example: 93, 187.
	Rate  float64 `json:"rate"`
	Burst float64 `json:"burst"`
	// Allowed and Denied are what they reported since the bucket was
	// first reported here.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}
