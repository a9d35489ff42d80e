package replay

import (
	"fmt"
	"time"
)

// pacer spaces records at a rate per second: the bound that keeps a
// replay from taking the brokers' and Postgres' capacity from live
// delivery. It owns no clock: the caller passes the time and sleeps the
// delay it returns.
type pacer struct {
	every time.Duration // 0: no limit
	next  time.Time     // when the next record may go
}

func newPacer(perSecond float64) pacer {
	if perSecond <= 0 {
		return pacer{}
	}
	return pacer{every: time.Duration(float64(time.Second) / perSecond)}
}

// minSleep: delays below it are not slept but carried into the next
// record's, so that a high rate does not cost a timer per record.
const minSleep = time.Millisecond

// delay books the next record at now and returns how long to wait before
// sending it. Time spent elsewhere (waiting for acknowledgements, reading a
// page) is not made up for with a burst afterwards: the rate is a ceiling.
func (p *pacer) delay(now time.Time) time.Duration {
	if p.every == 0 {
		return 0
	}
	if p.next.Before(now) {
		p.next = now
	}
	d := p.next.Sub(now)
	p.next = p.next.Add(p.every)
	if d < minSleep {
		return 0
	}
	return d
}

// rate describes the limit for the log.
func (p pacer) rate() string {
	if p.every == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%.6g/s", float64(time.Second)/float64(p.every))
}
