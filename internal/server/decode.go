package server

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/checkapi"
)

// smallBody is the longest body decodeRequest reads in one piece: a
// check's is tens of bytes.
const smallBody = 512

var bodyPool = sync.Pool{New: func() any { b := make([]byte, smallBody+1); return &b }}

// decodeRequest is decode for the check API's Request: a small body whose
// length is declared is read whole and, in the common shape, parsed by
// checkapi.ParseRequest without encoding/json's reflection; any other
// body, or one ParseRequest declines, goes to encoding/json as decode
// reads it (the bytes read so far replayed, then the rest of the body or
// the error that ended it), so every answer and error is decode's.
func (s *Server) decodeRequest(w http.ResponseWriter, r *http.Request, in *checkapi.Request) string {
	n := r.ContentLength
	if n <= 0 || n > smallBody || n > s.maxBody {
		return s.decode(w, r, in)
	}
	bp := bodyPool.Get().(*[]byte)
	defer bodyPool.Put(bp)
	b := (*bp)[:n+1] // a body of its declared length ends in io.EOF at n
	got := 0
	var err error
	for err == nil && got < len(b) {
		var k int
		k, err = r.Body.Read(b[got:])
		got += k
	}
	zero := *in
	if err == io.EOF && got == int(n) && checkapi.ParseRequest(b[:n], in) {
		return ""
	}
	*in = zero
	var rest io.Reader = r.Body
	if err != nil {
		rest = errReader{err}
	}
	return decodeFrom(http.MaxBytesReader(w, io.NopCloser(io.MultiReader(bytes.NewReader(b[:got]), rest)), s.maxBody), in)
}

// errReader returns err on every read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

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
