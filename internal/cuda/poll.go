package cuda

import (
	"time"

	"github.com/goep/goep/internal/poll"
)

// syncPolicy is how Stream.Synchronize and Event.Synchronize poll for the
// completion of GPU work. Go's timers sleep at least about a millisecond on
// Linux whatever they are asked for, so sleeping from the first poll made
// every wait for work still in flight (a layout's summary, a small
// dispatch) cost a millisecond or more: the polls spin, yielding the
// processor between queries, for 200µs; work that takes longer is then
// polled with sleeps from 20µs doubling to 500µs.
var syncPolicy = poll.Policy{Spin: 200 * time.Microsecond, First: 20 * time.Microsecond, Most: 500 * time.Microsecond}
