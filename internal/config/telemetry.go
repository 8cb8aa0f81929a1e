package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// The OTLP protocols Telemetry.Protocol names.
const (
	ProtocolGRPC = "grpc" // OTLP over gRPC, port 4317 by convention
	ProtocolHTTP = "http" // OTLP over HTTP (protobuf), port 4318 by convention
)

// DefaultServiceName is Telemetry.ServiceName when absent.
const DefaultServiceName = "sluice"

// Telemetry configures the export of traces over OTLP: each decision,
// and the check API's, the proxy's and the Envoy service's requests, as
// spans that continue the W3C trace context a request carries.
type Telemetry struct {
	// Endpoint is the OTLP collector's URL: http://host:port sends in
	// clear text, https://host:port over TLS; a path is kept for the http
	// protocol (default /v1/traces). Required.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTP. Default: ProtocolGRPC.
	Protocol string
	// SamplingRatio is the share of traces started here that are
	// recorded, 0 to 1; a request whose caller's trace context says
	// sampled or not keeps that choice. Default: 1.
	SamplingRatio float64
	// ServiceName is the service.name resource attribute. Default:
	// DefaultServiceName.
	ServiceName string
}

// telemetry decodes the telemetry section; nil when it is not a mapping.
func (d *decoder) telemetry(n *yaml.Node) *Telemetry {
	m, ok := d.mapping("telemetry", n, "endpoint", "protocol", "sampling_ratio", "service_name")
	if !ok {
		return nil
	}
	t := &Telemetry{Protocol: ProtocolGRPC, SamplingRatio: 1, ServiceName: DefaultServiceName}
	d.str("telemetry.endpoint", m["endpoint"], &t.Endpoint)
	d.str("telemetry.protocol", m["protocol"], &t.Protocol)
	d.float("telemetry.sampling_ratio", m["sampling_ratio"], &t.SamplingRatio)
	d.str("telemetry.service_name", m["service_name"], &t.ServiceName)
	return t
}

// validateTelemetry checks the telemetry section, when there is one.
func (c *Config) validateTelemetry() []*Error {
	t := c.Telemetry
	if t == nil {
		return nil
	}
	var errs []*Error
	if t.Endpoint == "" {
		errs = append(errs, c.errorAt("telemetry.endpoint", "", "is required: the collector's URL, such as http://127.0.0.1:4317"))
	} else if rule := checkEndpoint(t.Endpoint); rule != "" {
		errs = append(errs, c.errorAt("telemetry.endpoint", strconv.Quote(t.Endpoint), rule))
	}
	if t.Protocol != ProtocolGRPC && t.Protocol != ProtocolHTTP {
		errs = append(errs, c.errorAt("telemetry.protocol", strconv.Quote(t.Protocol), "must be one of grpc, http"))
	}
	if !(t.SamplingRatio >= 0 && t.SamplingRatio <= 1) {
		errs = append(errs, c.errorAt("telemetry.sampling_ratio", strconv.FormatFloat(t.SamplingRatio, 'g', -1, 64), "must be between 0 and 1"))
	}
	if n := len(t.ServiceName); n == 0 || n > 255 {
		errs = append(errs, c.errorAt("telemetry.service_name", strconv.Quote(t.ServiceName), fmt.Sprintf("must be 1 to 255 bytes, not %d", n)))
	}
	return errs
}

// checkEndpoint returns the rule an OTLP endpoint breaks, or "".
func checkEndpoint(s string) string {
	const rule = "must be the collector's URL, http://host:port or https://host:port, such as http://127.0.0.1:4317"
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return rule
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
		return rule + "; the port is required"
	}
	if n, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || n == 0 {
		return rule + "; the port must be a number between 1 and 65535"
	}
	return ""
}
