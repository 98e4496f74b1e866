package comm

import "time"

// slack is how late something due now may come on a loaded machine (a
// goroutine or process not scheduled for a while): a bound on promptness
// that a loaded machine meets, and far below the deadline of any wait that
// a hang would run into.
const slack = 2 * time.Second

// hang bounds the waits of tests for something that must happen at once
// (a release, an error): only a hang reaches it.
const hang = 30 * time.Second
