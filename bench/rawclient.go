package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// rawDecide returns a decideFunc that asks the server's check API over
// plain keep-alive TCP connections, at most one per caller, each
// subject's request encoded once and each answer read by a bounded
// parser: the client costs a write and a read per check, a fraction of
// net/http's client, so on a machine whose cores the client shares with
// the server the checks/s follow the server's cost, not the load
// generator's. 200 is an admission, 429 a denial, anything else an
// error.
func rawDecide(base, policy string, subjects []string, callers int) (decideFunc, func()) {
	host := strings.TrimPrefix(base, "http://")
	reqs := make([][]byte, len(subjects))
	for i, s := range subjects {
		body := `{"policy":"` + policy + `","subject":"` + s + `"}`
		reqs[i] = []byte("POST /v1/check HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	}
	idle := make(chan *rawConn, callers)
	decide := func(ctx context.Context, i int) (int, error) {
		var c *rawConn
		select {
		case c = <-idle:
		default:
			nc, err := net.DialTimeout("tcp", host, 10*time.Second)
			if err != nil {
				return 0, err
			}
			c = &rawConn{Conn: nc, br: bufio.NewReaderSize(nc, 4096)}
		}
		code, err := c.roundTrip(reqs[i])
		if err != nil {
			c.Close()
			return 0, fmt.Errorf("POST /v1/check: %w", err)
		}
		select {
		case idle <- c:
		default:
			c.Close()
		}
		switch code {
		case 200:
			return 1, nil
		case 429:
			return 0, nil
		}
		return 0, fmt.Errorf("POST /v1/check: status %d", code)
	}
	release := func() {
		for {
			select {
			case c := <-idle:
				c.Close()
			default:
				return
			}
		}
	}
	return decide, release
}

// rawConn is one keep-alive connection of rawDecide.
type rawConn struct {
	net.Conn
	br *bufio.Reader
	by time.Time // the deadline, moved every few seconds rather than per check
}

// maxAnswerFields bounds the header fields of an answer rawConn reads.
const maxAnswerFields = 64

// roundTrip writes req and reads its answer: the status code.
func (c *rawConn) roundTrip(req []byte) (int, error) {
	if now := time.Now(); c.by.Sub(now) < 5*time.Second {
		c.by = now.Add(10 * time.Second)
		c.SetDeadline(c.by)
	}
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 14 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, fmt.Errorf("status line %q", line)
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("status line %q", line)
	}
	length := -1
	for range maxAnswerFields {
		if line, err = c.br.ReadSlice('\n'); err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			if length < 0 {
				return 0, errors.New("answer without Content-Length")
			}
			_, err = c.br.Discard(length)
			return code, err
		}
		const cl = "content-length:"
		if len(line) > len(cl) && bytes.EqualFold(line[:len(cl)], []byte(cl)) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(line[len(cl):]))); err != nil || length < 0 {
				return 0, fmt.Errorf("field %q", bytes.TrimSpace(line))
			}
		}
	}
	return 0, fmt.Errorf("answer with more than %d header fields", maxAnswerFields)
}
