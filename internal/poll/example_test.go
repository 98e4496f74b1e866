package poll_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/goep/goep/internal/poll"
)

// Waiting for a flag that another goroutine (in goep: a GPU, a peer
// process, the network) sets.
func ExampleUntil() {
	var flag atomic.Bool
	time.AfterFunc(time.Millisecond, func() { flag.Store(true) })
	p := poll.Policy{Spin: 100 * time.Microsecond, First: 10 * time.Microsecond, Most: time.Millisecond}
	err := poll.Until(context.Background(), p, func() (bool, error) { return flag.Load(), nil })
	fmt.Println(err, flag.Load())
	// Output: <nil> true
}
