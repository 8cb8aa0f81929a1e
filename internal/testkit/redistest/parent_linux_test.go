package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// diesEnv makes this test binary a helper that starts a server, prints its
// address and dies without running any cleanup.
const diesEnv = "REDISTEST_DIE_AFTER_START"

func TestMain(m *testing.M) {
	if os.Getenv(diesEnv) != "" {
		s, err := StartServer(os.TempDir())
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(s.Addr)
		select {} // killed by the parent
	}
	os.Exit(m.Run())
}

// TestServerDiesWithItsTestProcess: a test binary killed before its
// cleanups run leaves no redis-server behind.
func TestServerDiesWithItsTestProcess(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), diesEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("helper: %v", err)
	}
	addr := line[:len(line)-1]
	if c, err := net.Dial("tcp", addr); err != nil {
		cmd.Process.Kill()
		t.Fatalf("the helper's server at %s does not answer: %v", addr, err)
	} else {
		c.Close()
	}
	cmd.Process.Kill()
	cmd.Wait()
	for range 200 { // bounded: 10 s at most
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return // gone with its parent
		}
		c.Close()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redis-server at %s still answers 10s after its test process was killed", addr)
}
