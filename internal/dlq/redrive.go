package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// Options are a redrive's.
type Options struct {
	Topic  string // the dead-letter topic
	Filter Filter // which pending dead letters (Filter.All is ignored)
	// Batch is how many dead letters go in one batch (one Kafka
	// transaction in exactly_once); 0: 500.
	Batch int
}

// Result is what a redrive did.
type Result struct {
	Redriven []*Letter  `json:"redriven"`       // now in their intended topics, and marked
	Failed   []*Failure `json:"failed_again"`   // written again with the new reason
	Skipped  []*Letter  `json:"not_redrivable"` // as they are (Letter.NotRedrivable)
	// NotPending are the ids Filter.IDs asked for that have no pending dead
	// letter: never dead-lettered, or redriven already.
	NotPending []string `json:"not_pending,omitempty"`
}

// Failure is a dead letter that failed again.
type Failure struct {
	*Letter
	Again string `json:"again"` // the new reason
}

// TransactionalID is the transactional id of a redrive of topic in
// kafka.delivery: exactly_once.
func TransactionalID(topic string) string { return "outboxd-dlq-redrive-" + topic }

// Redrive sends the pending dead letters of opts.Topic that opts.Filter
// selects to their intended topics, with their original key, value and
// headers (the id header among them), and marks each in the dead-letter
// topic; a dead letter that fails again is written again there with the
// new reason. It reads the topic after initialising its producer, so that
// in exactly_once it sees the outcome of any earlier run. On an error the
// dead letters not marked yet stay pending: the next run sends them.
func Redrive(ctx context.Context, cfg config.Config, opts Options, log *slog.Logger) (*Result, error) {
	reg := prometheus.NewRegistry()
	r := &run{cfg: cfg, dlq: opts.Topic, log: log, m: sink.NewMetrics(reg), res: &Result{}}
	if cfg.Kafka.ExactlyOnce() {
		r.tm = sink.NewTxnMetrics(reg)
	}
	defer func() {
		if r.p != nil {
			r.p.Close()
		}
	}()
	if err := r.open(ctx); err != nil {
		return nil, err
	}
	t, err := Read(ctx, cfg.Kafka, FallbackOf(cfg), opts.Topic)
	if err != nil {
		return nil, err
	}
	f := opts.Filter
	f.All = false
	var todo []*Letter
	sel := t.Select(f)
	for _, id := range f.IDs {
		if !slices.ContainsFunc(sel, func(l *Letter) bool { return l.EventID == id }) {
			r.res.NotPending = append(r.res.NotPending, id)
		}
	}
	for _, l := range sel {
		if l.NotRedrivable != "" {
			r.res.Skipped = append(r.res.Skipped, l)
		} else {
			todo = append(todo, l)
		}
	}
	inSourceOrder(todo)
	log.Info("redriving dead letters", "topic", opts.Topic, "selected", len(todo), "not_redrivable", len(r.res.Skipped),
		"delivery", cfg.Kafka.Delivery)
	n := opts.Batch
	if n <= 0 {
		n = 500
	}
	n = min(n, cfg.Kafka.MaxBufferedRecords)
	logged := time.Now()
	for len(todo) > 0 {
		b := todo[:min(n, len(todo))]
		todo = todo[len(b):]
		if err := r.batch(ctx, b); err != nil {
			return r.res, err
		}
		if time.Since(logged) > 10*time.Second {
			log.Info("redrive progress", "topic", opts.Topic, "redriven", len(r.res.Redriven), "failed_again", len(r.res.Failed), "left", len(todo))
			logged = time.Now()
		}
	}
	return r.res, nil
}

// inSourceOrder sorts letters by their source LSN, the order of their rows'
// commits: a key's dead letters may be in several partitions (written
// before and after the dead-letter topic got more partitions), and a
// rewritten dead letter follows later ones of its key in its partition. A
// letter without a source LSN goes first; ties keep partition and offset
// order.
func inSourceOrder(letters []*Letter) {
	lsn := func(l *Letter) pglogrepl.LSN {
		v, _ := pglogrepl.ParseLSN(l.SourceLSN)
		return v
	}
	slices.SortStableFunc(letters, func(a, b *Letter) int { return cmp.Compare(lsn(a), lsn(b)) })
}

// run is one redrive: its producer, replaced after a record Kafka failed
// (a sink.Producer ends at its first failure), and what it did.
type run struct {
	cfg config.Config
	dlq string
	log *slog.Logger
	m   *sink.Metrics
	tm  *sink.TxnMetrics // exactly_once only
	p   *sink.Producer
	res *Result
}

func (r *run) eos() bool { return r.tm != nil }

// fenced returns err as a *sink.FencedError when Kafka's answer says this
// run was fenced, or, in exactly_once, when the transaction coordinator
// holds a newer epoch: under transactions version 1 a fenced producer's
// write may be answered INVALID_TXN_STATE, which means other things too,
// so the coordinator is asked.
func (r *run) fenced(ctx context.Context, err error) error {
	err = r.p.AsFenced(err)
	var fe *sink.FencedError
	if !r.eos() || errors.As(err, &fe) {
		return err
	}
	newer, askErr := r.p.Fenced(context.WithoutCancel(ctx))
	switch {
	case askErr != nil:
		return fmt.Errorf("%w (could not ask the transaction coordinator whether another redrive took over: %v)", err, askErr)
	case newer:
		return &sink.FencedError{TransactionalID: r.p.TransactionalID(), Err: err}
	}
	return err
}

// open makes the producer: transactional in exactly_once (Init fences an
// earlier run of the same topic and settles its last transaction).
func (r *run) open(ctx context.Context) error {
	if !r.eos() {
		p, err := sink.New(r.cfg.Kafka, r.m, r.log)
		if err != nil {
			return err
		}
		r.p = p
		return r.p.Warm(ctx)
	}
	p, err := sink.NewTransactional(r.cfg.Kafka, r.m, r.tm, r.log, TransactionalID(r.dlq))
	if err != nil {
		return err
	}
	r.p = p
	if err := r.p.Init(ctx); err != nil {
		return err
	}
	return r.p.EnsurePositionsTopic(ctx)
}

// reopen ends the producer after a failure and makes a new one.
func (r *run) reopen(ctx context.Context) error {
	r.abort(ctx)
	r.p.Close()
	r.p = nil
	return r.open(ctx)
}

func (r *run) begin() error {
	if r.eos() {
		return r.p.Begin()
	}
	return nil
}

// abort aborts the open Kafka transaction, if any, with a short deadline of
// its own (ctx may be done): an abandoned one would hold read_committed
// consumers back until kafka.transaction_timeout.
func (r *run) abort(ctx context.Context) {
	if !r.eos() || r.p == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.p.Abort(actx); err != nil {
		r.log.Warn("aborting the redrive's Kafka transaction", "topic", r.dlq, "err", err)
	}
}

// progress is the position a redrive commits with its transactions in
// exactly_once (kafka.positions_topic, keyed by its transactional id). It
// is informational: the markers in the dead-letter topic are the record.
type progress struct {
	Topic    string    `json:"dlq_topic"`
	Redriven int       `json:"redriven"`
	Failed   int       `json:"failed_again"`
	At       time.Time `json:"at"`
}

func (r *run) commit(ctx context.Context) error {
	if !r.eos() {
		return nil
	}
	pos, _ := json.Marshal(progress{Topic: r.dlq, Redriven: len(r.res.Redriven), Failed: len(r.res.Failed), At: time.Now().UTC()})
	return r.p.Commit(ctx, pos)
}

// batch redrives letters: it sends their records, then their markers (or,
// for those that failed again, the rewritten dead letters), and in
// exactly_once commits all of it in one Kafka transaction. When Kafka fails
// a record, which fails every later one of the producer, it goes on with a
// new producer one letter at a time, to tell which failed for its own
// reason; in at_least_once the records Kafka acknowledged before are not
// sent again, only marked.
func (r *run) batch(ctx context.Context, letters []*Letter) (err error) {
	if err := r.begin(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			r.abort(ctx)
		}
	}()
	recs := make([]*router.Record, len(letters))
	for i, l := range letters {
		recs[i] = l.record()
	}
	refused, failed, err := r.send(ctx, recs)
	if err != nil {
		return err
	}
	again := make([]string, len(letters)) // the new reason of those that failed again
	for i, e := range refused {
		if e != nil {
			again[i] = newReason(e)
		}
	}
	broke := errors.Join(failed...)
	if broke == nil {
		return r.settle(ctx, letters, again)
	}
	// Only a record's own fault is worth a new producer: after any other
	// failure (brokers down, a stall, another run fencing this one) a new
	// producer would fail the same way, or, in exactly_once, fence the
	// run that fenced this one and send again what it sent.
	for i, e := range failed {
		if e != nil && !recordFault(e) && (len(letters) == 1 || !earlier(ctx, e)) {
			return fmt.Errorf("redriving event %s to %s: %w", letters[i].EventID, letters[i].Topic, r.fenced(ctx, e))
		}
	}
	if err := r.reopen(ctx); err != nil {
		return err
	}
	if len(letters) == 1 {
		if err := r.begin(); err != nil {
			return err
		}
		return r.settle(ctx, letters, []string{newReason(broke)})
	}
	var still map[string]bool
	if r.eos() {
		// The new producer's Init fenced any other run of the topic:
		// what such a run committed meanwhile is no longer pending.
		if still, err = r.pending(ctx); err != nil {
			return err
		}
	}
	var acked []*Letter
	var ackedAgain []string
	for i, l := range letters {
		if !r.eos() && failed[i] == nil { // in Kafka already, or refused before it was sent
			acked, ackedAgain = append(acked, l), append(ackedAgain, again[i])
			continue
		}
		if still != nil && !still[l.Ref()] {
			continue
		}
		if err := r.batch(ctx, []*Letter{l}); err != nil {
			return err
		}
	}
	if len(acked) == 0 {
		return nil
	}
	return r.settle(ctx, acked, ackedAgain)
}

// pending reads the dead-letter topic again and returns the refs of its
// pending dead letters.
func (r *run) pending(ctx context.Context) (map[string]bool, error) {
	t, err := Read(ctx, r.cfg.Kafka, FallbackOf(r.cfg), r.dlq)
	if err != nil {
		return nil, err
	}
	refs := map[string]bool{}
	for _, l := range t.Select(Filter{}) {
		refs[l.Ref()] = true
	}
	return refs, nil
}

// settle marks letters as redriven, or writes those with a new reason in
// again again, and commits the open transaction (exactly_once).
func (r *run) settle(ctx context.Context, letters []*Letter, again []string) error {
	recs := make([]*router.Record, len(letters))
	for i, l := range letters {
		if again[i] != "" {
			recs[i] = l.again(r.dlq, again[i])
		} else {
			recs[i] = l.marker(r.dlq)
		}
	}
	refused, failed, err := r.send(ctx, recs)
	if err == nil {
		err = errors.Join(append(refused, failed...)...)
	}
	if err != nil {
		return fmt.Errorf("marking redriven dead letters in %s: %w", r.dlq, r.fenced(ctx, err))
	}
	if err := r.commit(ctx); err != nil {
		return r.fenced(ctx, err)
	}
	for i, l := range letters {
		if again[i] != "" {
			r.res.Failed = append(r.res.Failed, &Failure{Letter: l, Again: again[i]})
		} else {
			r.res.Redriven = append(r.res.Redriven, l)
		}
	}
	return nil
}

// send hands recs (nil ones are left out) to the producer and waits for
// Kafka's answers. refused[i] is the error of a record the producer did not
// take for its own reason (recordFault), failed[i] that of a record Kafka
// failed, or that the producer did not take because an earlier one failed
// (*sink.NotHandedOverError); err ends the run.
func (r *run) send(ctx context.Context, recs []*router.Record) (refused, failed []error, err error) {
	refused, failed = make([]error, len(recs)), make([]error, len(recs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, rec := range recs {
		if rec == nil {
			continue
		}
		wg.Add(1)
		err := r.p.Produce(ctx, rec, func(err error) {
			mu.Lock()
			failed[i] = err
			mu.Unlock()
			wg.Done()
		})
		var earlier *sink.NotHandedOverError
		switch {
		case err == nil:
		case errors.As(err, &earlier):
			wg.Done()
			failed[i] = err // not its own fault: the caller tries it again alone
		case recordFault(err):
			wg.Done()
			refused[i] = err
		default:
			wg.Done()
			return nil, nil, fmt.Errorf("redriving event %s to %s: %w", rec.EventID, rec.Topic, r.fenced(ctx, err))
		}
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stall := make(chan error, 1)
	go func() { stall <- r.p.Watch(wctx, nil) }()
	select {
	case <-all:
		cancel()
		<-stall
		mu.Lock()
		defer mu.Unlock()
		return refused, failed, nil
	case err := <-stall:
		if err == nil {
			err = ctx.Err()
		}
		return nil, nil, err // the caller closes the producer, which fails what is in flight
	}
}

// recordFault reports whether err is the record's own: Kafka, or outboxd,
// would refuse it again until its cause is fixed. Any other error (brokers
// down, a stall, fencing) ends the run instead.
func recordFault(err error) bool {
	var earlier *sink.NotHandedOverError
	if errors.As(err, &earlier) {
		return false // the earlier record's fault
	}
	var row *router.RowError
	var topic *sink.TopicRefusedError
	var de *sink.DeliveryError
	switch {
	case errors.As(err, &row), errors.As(err, &topic):
		return true
	case errors.As(err, &de) && de.Rejected():
		return true
	}
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.InvalidTopicException) ||
		errors.Is(err, kerr.PolicyViolation)
}

// earlier reports whether err failed a record because an earlier record of
// the producer failed: the producer did not hand it over
// (*sink.NotHandedOverError), or franz-go failed it unwritten when that
// failure broke the producer's fence, the context of every record (context
// canceled while ctx is not). Such a record may be sound.
func earlier(ctx context.Context, err error) bool {
	var nho *sink.NotHandedOverError
	return errors.As(err, &nho) || (errors.Is(err, context.Canceled) && ctx.Err() == nil)
}

// newReason is the reason written with a dead letter that failed again.
func newReason(err error) string {
	var row *router.RowError
	if errors.As(err, &row) {
		return "redrive: " + row.Reason
	}
	return "redrive: " + err.Error()
}
