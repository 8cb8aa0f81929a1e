package server

import (
	"net/http"
	"sync/atomic"
	"time"
)

// dateField is the Date header field of the second it was made in.
type dateField struct {
	sec int64
	v   []string
}

var lastDate atomic.Pointer[dateField]

// date returns the Date field net/http would write now, made once a
// second rather than formatted for every answer (4 % of a check's
// server CPU). The answer sets it, so net/http writes it as it is.
func date() []string {
	now := time.Now()
	if d := lastDate.Load(); d != nil && d.sec == now.Unix() {
		return d.v
	}
	d := &dateField{sec: now.Unix(), v: []string{now.UTC().Format(http.TimeFormat)}}
	lastDate.Store(d)
	return d.v
}
