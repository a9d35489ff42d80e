package shard

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
)

// cluster models what Next observes and what its actions do: a WAL of
// committed transactions (one per key), slots that deliver the transactions
// ending after their confirmed position that their shard owns, the state
// table's row and a Kafka log of deliveries. Writers commit a transaction
// before every step of every action. crashAt kills the executor before the
// given step (counted over the whole run); what was done stays done.
type cluster struct {
	t       *testing.T
	rng     *rand.Rand
	head    pglogrepl.LSN
	txns    []txn
	slots   map[string]*Slot
	pubs    map[string]bool
	plan    *Plan
	log     []int // indexes of txns, in delivery order
	steps   int
	crashAt map[int]bool
	crashes int
}

type txn struct {
	end pglogrepl.LSN
	key string
}

var errCrash = errors.New("killed")

func newCluster(t *testing.T, seed uint64, from int) *cluster {
	c := &cluster{t: t, rng: rand.New(rand.NewPCG(seed, 1)), slots: map[string]*Slot{}, pubs: map[string]bool{}, crashAt: map[int]bool{}}
	c.head = 0x1000000
	shards, err := layout(View{Slot: "outboxd", Publication: "outboxd"}, from)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		c.pubs[s.Publication] = true
		c.slots[s.Slot] = &Slot{Name: s.Slot, Confirmed: c.head}
	}
	for range 20 {
		c.write()
	}
	for _, s := range shards {
		c.deliver(s, Window{})
		c.slots[s.Slot].Confirmed = c.head
	}
	return c
}

func (c *cluster) write() {
	c.head += pglogrepl.LSN(16 + c.rng.IntN(64))
	c.txns = append(c.txns, txn{c.head, fmt.Sprintf("k%d", c.rng.IntN(16))})
}

// step is one unit of an action: writers commit, then the executor is
// killed here or goes on.
func (c *cluster) step() error {
	c.write()
	c.steps++
	if c.crashAt[c.steps] {
		c.crashes++
		return errCrash
	}
	return nil
}

func (c *cluster) view(want int) View {
	v := View{Slot: "outboxd", Publication: "outboxd", Want: want}
	if c.plan != nil {
		p := *c.plan
		v.Plan = &p
	}
	for _, s := range c.slots {
		v.Slots = append(v.Slots, *s)
	}
	for p := range c.pubs {
		v.Publications = append(v.Publications, p)
	}
	// Other slots and publications of the database are ignored.
	v.Slots = append(v.Slots, Slot{Name: "someone_else", Confirmed: 1})
	v.Publications = append(v.Publications, "someone_else")
	c.rng.Shuffle(len(v.Slots), func(i, j int) { v.Slots[i], v.Slots[j] = v.Slots[j], v.Slots[i] })
	return v
}

// deliver sends what shard s's slot holds within w to Kafka.
func (c *cluster) deliver(s Shard, w Window) {
	sl := c.slots[s.Slot]
	for i, tx := range c.txns {
		if tx.end <= sl.Confirmed || !w.Delivers(tx.end) {
			continue
		}
		if w.Past(tx.end) {
			break
		}
		if Of([]byte(tx.key), s.Count) == s.Index {
			c.log = append(c.log, i)
		}
	}
}

// run performs a; a kill leaves it half done.
func (c *cluster) run(a Action) error {
	switch a.Kind {
	case Stream:
		for _, s := range a.Shards {
			if c.slots[s.Slot] == nil { // made as an unsharded outboxd makes its slot
				c.slots[s.Slot] = &Slot{Name: s.Slot, Confirmed: c.head}
				c.pubs[s.Publication] = true
			}
			if err := c.step(); err != nil {
				return err
			}
			pos := c.head
			c.deliver(s, Window{})
			if err := c.step(); err != nil {
				return err
			}
			c.slots[s.Slot].Confirmed = pos
		}
	case Begin:
		if err := c.step(); err != nil {
			return err
		}
		if c.plan == nil {
			p := a.Plan
			c.plan = &p
		}
	case Create:
		for _, p := range a.Publications {
			if err := c.step(); err != nil {
				return err
			}
			c.pubs[p] = true
		}
		for _, s := range a.Slots {
			if err := c.step(); err != nil {
				return err
			}
			if c.slots[s] != nil {
				c.t.Fatalf("asked to create slot %s, which exists", s)
			}
			c.slots[s] = &Slot{Name: s, Confirmed: c.head} // its consistent point
		}
	case Cutover:
		if err := c.step(); err != nil {
			return err
		}
		if *c.plan == a.Plan {
			c.plan.Phase, c.plan.Cutover = Draining, a.Cutover
		}
	case Drain:
		for _, s := range a.Shards {
			if err := c.step(); err != nil {
				return err
			}
			c.deliver(s, a.Window)
			if err := c.step(); err != nil {
				return err
			}
			// Idle at the end of its window, the pipeline confirms the
			// server's WAL end, capped.
			sl := c.slots[s.Slot]
			sl.Confirmed = max(sl.Confirmed, a.Window.Confirm(c.head))
		}
	case Switch:
		if err := c.step(); err != nil {
			return err
		}
		if *c.plan == a.Plan {
			c.plan.Phase = Switched
		}
	case DropOld, Rollback:
		if a.Kind == Rollback {
			if err := c.step(); err != nil {
				return err
			}
			if *c.plan != a.Plan {
				c.t.Fatalf("rolling back %+v, but the row is %+v", a.Plan, *c.plan)
			}
			c.plan.Phase = RollingBack
		}
		for _, s := range a.Slots {
			if err := c.step(); err != nil {
				return err
			}
			delete(c.slots, s)
		}
		for _, p := range a.Publications {
			if err := c.step(); err != nil {
				return err
			}
			delete(c.pubs, p)
		}
		if a.Kind == Rollback {
			if err := c.step(); err != nil {
				return err
			}
			c.plan = nil
		}
	case Advance:
		for _, s := range a.Slots {
			if err := c.step(); err != nil {
				return err
			}
			sl := c.slots[s]
			sl.Confirmed = max(sl.Confirmed, a.Cutover)
		}
	case Finish:
		if err := c.step(); err != nil {
			return err
		}
		if *c.plan != a.Plan {
			c.t.Fatalf("finishing %+v, but the row is %+v", a.Plan, *c.plan)
		}
		c.plan = nil
	default:
		c.t.Fatalf("unexpected action %v", a.Kind)
	}
	return nil
}

// reshard drives Next to Stream and runs it once to its end; flip, if
// set, may change the wanted count after each kill. It returns the count
// reached.
func (c *cluster) reshard(want int, flip func(want int) int) int {
	c.t.Helper()
	for range 1000 {
		a, err := Next(c.view(want))
		if err != nil {
			if flip != nil && strings.Contains(err.Error(), "can only finish") {
				want = c.plan.To
				continue
			}
			c.t.Fatalf("Next: %v (plan %+v)", err, c.plan)
		}
		if a.Kind == Stream {
			if err := c.run(a); err != nil {
				continue
			}
			// The writers stop; the shards catch up.
			for _, s := range a.Shards {
				c.deliver(s, Window{})
				c.slots[s.Slot].Confirmed = c.head
			}
			if len(c.slots) != want {
				c.t.Fatalf("streaming %d shards with slots %v left", want, slices.Sorted(maps.Keys(c.slots)))
			}
			return want
		}
		if err := c.run(a); err != nil && flip != nil {
			want = flip(want)
		}
	}
	c.t.Fatalf("no Stream after 1000 actions (plan %+v)", c.plan)
	return 0
}

// check asserts no transaction lost and, per key, first deliveries in
// commit order; dups reports whether any was delivered twice.
func (c *cluster) check() (dups int) {
	c.t.Helper()
	seen := make([]bool, len(c.txns))
	last := map[string]int{}
	for _, i := range c.log {
		if seen[i] {
			dups++
			continue
		}
		seen[i] = true
		k := c.txns[i].key
		if j, ok := last[k]; ok && j > i {
			c.t.Fatalf("key %s: transaction %d delivered after %d", k, i, j)
		}
		last[k] = i
	}
	for i, ok := range seen {
		if !ok {
			c.t.Fatalf("transaction %d (end %s, key %s) lost; %d kills", i, c.txns[i].end, c.txns[i].key, c.crashes)
		}
	}
	return dups
}

var reshards = [][2]int{{1, 2}, {2, 1}, {1, 4}, {4, 2}, {2, 4}, {2, 3}, {3, 8}}

// Every step, without a kill: nothing lost, nothing repeated.
func TestReshardClean(t *testing.T) {
	for _, r := range reshards {
		t.Run(fmt.Sprintf("%dto%d", r[0], r[1]), func(t *testing.T) {
			c := newCluster(t, 1, r[0])
			c.reshard(r[1], nil)
			if dups := c.check(); dups != 0 {
				t.Errorf("%d transactions delivered twice without a kill", dups)
			}
			if c.plan != nil {
				t.Errorf("the row is left: %+v", c.plan)
			}
		})
	}
}

// A kill before every step of the whole protocol, one per run: it resumes
// to the new count without loss or reorder.
func TestReshardKillAtEveryStep(t *testing.T) {
	for _, r := range reshards {
		t.Run(fmt.Sprintf("%dto%d", r[0], r[1]), func(t *testing.T) {
			clean := newCluster(t, 2, r[0])
			clean.reshard(r[1], nil)
			for k := 1; k <= clean.steps; k++ {
				c := newCluster(t, 2, r[0])
				c.crashAt[k] = true
				c.reshard(r[1], nil)
				c.check()
				if c.crashes != 1 {
					t.Fatalf("kill at step %d of %d did not happen", k, clean.steps)
				}
			}
		})
	}
}

// A kill before every step, after which the operator sets the old count
// back: before the switch the reshard rolls back, after it it finishes.
func TestReshardRollbackAfterAKillAtEveryStep(t *testing.T) {
	for _, r := range reshards {
		t.Run(fmt.Sprintf("%dto%d", r[0], r[1]), func(t *testing.T) {
			clean := newCluster(t, 3, r[0])
			clean.reshard(r[1], nil)
			outcomes := map[int]int{}
			for k := 1; k <= clean.steps; k++ {
				c := newCluster(t, 3, r[0])
				c.crashAt[k] = true
				got := c.reshard(r[1], func(int) int { return r[0] })
				c.check()
				outcomes[got]++
			}
			if outcomes[r[0]] == 0 || outcomes[r[1]] == 0 {
				t.Errorf("kills at %d steps ended with %v shards; want both rollbacks and forced finishes", clean.steps, outcomes)
			}
		})
	}
}

// Many kills at random, the wanted count flipping after some of them.
func TestReshardRandomKillsAndFlips(t *testing.T) {
	for seed := range uint64(300) {
		r := reshards[int(seed)%len(reshards)]
		c := newCluster(t, seed, r[0])
		for k := 1; k < 400; k++ {
			if c.rng.IntN(5) == 0 {
				c.crashAt[k] = true
			}
		}
		c.reshard(r[1], func(want int) int {
			if c.rng.IntN(3) == 0 {
				if want == r[0] {
					return r[1]
				}
				return r[0]
			}
			return want
		})
		c.check()
	}
}

func TestNext(t *testing.T) {
	slot := func(name string, lsn pglogrepl.LSN, active bool) Slot {
		return Slot{Name: name, Confirmed: lsn, Active: active}
	}
	for _, tc := range []struct {
		name string
		v    View
		want Action
		err  string
	}{
		{name: "fresh, unsharded",
			v:    View{Want: 1},
			want: Action{Kind: Stream, Shards: []Shard{{0, 1, "outboxd", "outboxd"}}}},
		{name: "steady at 2",
			v:    View{Want: 2, Slots: []Slot{slot("outboxd_0of2", 5, true), slot("outboxd_1of2", 5, false)}},
			want: Action{Kind: Stream, Shards: []Shard{{0, 2, "outboxd_0of2", "outboxd_0of2"}, {1, 2, "outboxd_1of2", "outboxd_1of2"}}}},
		{name: "a new count begins a reshard",
			v:    View{Want: 2, Slots: []Slot{slot("outboxd", 5, false)}},
			want: Action{Kind: Begin, Plan: Plan{From: 1, To: 2, Phase: Creating}}},
		{name: "an old slot missing refuses to begin",
			v:   View{Want: 1, Slots: []Slot{slot("outboxd_0of2", 5, false)}},
			err: "the slots outboxd_1of2 of the 2 shards are gone"},
		{name: "two layouts without a row",
			v:   View{Want: 2, Slots: []Slot{slot("outboxd", 5, false), slot("outboxd_0of4", 5, false)}},
			err: "several shard counts ([1 4]) exist"},
		{name: "a slot of the wanted count beside another",
			v:   View{Want: 2, Slots: []Slot{slot("outboxd", 5, false), slot("outboxd_0of2", 5, false)}},
			err: "several shard counts"},
		{name: "create what is missing",
			v: View{Want: 2, Plan: &Plan{1, 2, Creating, 0}, Publications: []string{"outboxd", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 5, false), slot("outboxd_0of2", 7, false)}},
			want: Action{Kind: Create, Plan: Plan{1, 2, Creating, 0}, Publications: []string{"outboxd_0of2"}, Slots: []string{"outboxd_1of2"}}},
		{name: "cutover at the highest position",
			v: View{Want: 2, Plan: &Plan{1, 2, Creating, 0}, Publications: []string{"outboxd_0of2", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 5, false), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 7, false)}},
			want: Action{Kind: Cutover, Plan: Plan{1, 2, Creating, 0}, Cutover: 9, Shards: []Shard{{0, 1, "outboxd", "outboxd"}}}},
		{name: "an old slot ahead of the new ones sets the cutover",
			v: View{Want: 2, Plan: &Plan{1, 2, Creating, 0}, Publications: []string{"outboxd_0of2", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 12, false), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 7, false)}},
			want: Action{Kind: Cutover, Plan: Plan{1, 2, Creating, 0}, Cutover: 12, Shards: []Shard{{0, 1, "outboxd", "outboxd"}}}},
		{name: "an old shard's position in Kafka past its slot sets the cutover (exactly-once, a killed instance)",
			v: View{Want: 4, Plan: &Plan{2, 4, Creating, 0}, Publications: []string{"outboxd_0of4", "outboxd_1of4", "outboxd_2of4", "outboxd_3of4"},
				Slots: []Slot{slot("outboxd_0of2", 8, false), slot("outboxd_1of2", 6, false),
					slot("outboxd_0of4", 9, false), slot("outboxd_1of4", 9, false), slot("outboxd_2of4", 9, false), slot("outboxd_3of4", 9, false)},
				Delivered: map[string]pglogrepl.LSN{"outboxd_0of2": 8, "outboxd_1of2": 14, "outboxd_0of4": 99}},
			want: Action{Kind: Cutover, Plan: Plan{2, 4, Creating, 0}, Cutover: 14,
				Shards: []Shard{{0, 2, "outboxd_0of2", "outboxd_0of2"}, {1, 2, "outboxd_1of2", "outboxd_1of2"}}}},
		{name: "positions in Kafka behind the slots change nothing",
			v: View{Want: 2, Plan: &Plan{1, 2, Creating, 0}, Publications: []string{"outboxd_0of2", "outboxd_1of2"},
				Slots:     []Slot{slot("outboxd", 12, false), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 7, false)},
				Delivered: map[string]pglogrepl.LSN{"outboxd": 10}},
			want: Action{Kind: Cutover, Plan: Plan{1, 2, Creating, 0}, Cutover: 12, Shards: []Shard{{0, 1, "outboxd", "outboxd"}}}},
		{name: "no cutover while a slot is held",
			v: View{Want: 2, Plan: &Plan{1, 2, Creating, 0}, Publications: []string{"outboxd_0of2", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 5, true), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 7, false)}},
			want: Action{Kind: Wait, Plan: Plan{1, 2, Creating, 0}, Reason: `slot "outboxd" is in use; the cutover is taken when no slot of the old or new shards is`}},
		{name: "an old slot gone while creating",
			v:   View{Want: 2, Plan: &Plan{1, 2, Creating, 0}},
			err: "the old shards' slots outboxd are gone"},
		{name: "drain the old shards short of the cutover",
			v: View{Want: 1, Plan: &Plan{2, 1, Draining, 9},
				Slots: []Slot{slot("outboxd", 9, false), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 4, false)}},
			want: Action{Kind: Drain, Plan: Plan{2, 1, Draining, 9}, Shards: []Shard{{1, 2, "outboxd_1of2", "outboxd_1of2"}}, Window: Window{Upto: 9}}},
		{name: "switch when all confirmed",
			v: View{Want: 1, Plan: &Plan{2, 1, Draining, 9},
				Slots: []Slot{slot("outboxd", 9, false), slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 9, false)}},
			want: Action{Kind: Switch, Plan: Plan{2, 1, Draining, 9}}},
		{name: "a new slot gone while draining",
			v: View{Want: 1, Plan: &Plan{2, 1, Draining, 9},
				Slots: []Slot{slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 9, false)}},
			err: "set postgres.shards: 2 to roll the reshard back"},
		{name: "an old slot gone while draining",
			v: View{Want: 1, Plan: &Plan{2, 1, Draining, 9},
				Slots: []Slot{slot("outboxd", 9, false), slot("outboxd_0of2", 9, false)}},
			err: `slot "outboxd_1of2" of the old shards is gone before it confirmed the cutover`},
		{name: "switched without a cutover",
			v:   View{Want: 2, Plan: &Plan{1, 2, Switched, 0}},
			err: "switched without a recorded cutover"},
		{name: "draining without a cutover",
			v:   View{Want: 1, Plan: &Plan{2, 1, Draining, 0}},
			err: "without a recorded cutover"},
		{name: "drop the old shards, never an unsharded publication",
			v: View{Want: 2, Plan: &Plan{1, 2, Switched, 9}, Publications: []string{"outboxd", "outboxd_0of2", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 9, true), slot("outboxd_0of2", 3, false), slot("outboxd_1of2", 9, false)}},
			want: Action{Kind: DropOld, Plan: Plan{1, 2, Switched, 9}, Slots: []string{"outboxd"}}},
		{name: "drop old shard publications",
			v: View{Want: 1, Plan: &Plan{2, 1, Switched, 9}, Publications: []string{"outboxd", "outboxd_0of2", "outboxd_1of2"},
				Slots: []Slot{slot("outboxd", 9, false)}},
			want: Action{Kind: DropOld, Plan: Plan{2, 1, Switched, 9}, Publications: []string{"outboxd_0of2", "outboxd_1of2"}}},
		{name: "advance the new slots behind the cutover",
			v: View{Want: 2, Plan: &Plan{1, 2, Switched, 9},
				Slots: []Slot{slot("outboxd_0of2", 3, false), slot("outboxd_1of2", 9, false)}},
			want: Action{Kind: Advance, Plan: Plan{1, 2, Switched, 9}, Slots: []string{"outboxd_0of2"}, Cutover: 9}},
		{name: "finish",
			v: View{Want: 2, Plan: &Plan{1, 2, Switched, 9},
				Slots: []Slot{slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 9, false)}},
			want: Action{Kind: Finish, Plan: Plan{1, 2, Switched, 9}}},
		{name: "a new slot gone after the switch",
			v:   View{Want: 2, Plan: &Plan{1, 2, Switched, 9}, Slots: []Slot{slot("outboxd_0of2", 9, false)}},
			err: "gone after the switch"},
		{name: "the old count after the switch",
			v:   View{Want: 1, Plan: &Plan{1, 2, Switched, 9}},
			err: "past its cutover and can only finish: set postgres.shards: 2"},
		{name: "a third count",
			v:   View{Want: 4, Plan: &Plan{1, 2, Draining, 9}},
			err: "set postgres.shards: 2 to finish it, or 1 to roll it back, before changing to 4"},
		{name: "the old count rolls back",
			v: View{Want: 2, Plan: &Plan{2, 4, Draining, 9}, Publications: []string{"outboxd_0of4", "outboxd_0of2"},
				Slots: []Slot{slot("outboxd_0of2", 9, false), slot("outboxd_1of2", 9, false), slot("outboxd_3of4", 1, true)}},
			want: Action{Kind: Rollback, Plan: Plan{2, 4, Draining, 9}, Slots: []string{"outboxd_3of4"}, Publications: []string{"outboxd_0of4"}}},
		{name: "a rollback goes on whatever is wanted",
			v:    View{Want: 4, Plan: &Plan{2, 4, RollingBack, 9}},
			want: Action{Kind: Rollback, Plan: Plan{2, 4, RollingBack, 9}}},
		{name: "unknown phase",
			v:   View{Want: 2, Plan: &Plan{1, 2, "later", 9}},
			err: `unknown reshard phase "later"`},
		{name: "bad recorded counts",
			v:   View{Want: 2, Plan: &Plan{2, 2, Creating, 0}},
			err: "invalid"},
		{name: "bad wanted count",
			v:   View{Want: 0},
			err: "postgres.shards is 0"},
		{name: "names too long",
			v:   View{Want: 2, Slot: strings.Repeat("s", 60)},
			err: "postgres.slot: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.v.Slot == "" {
				tc.v.Slot = "outboxd"
			}
			tc.v.Publication = "outboxd"
			got, err := Next(tc.v)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	if Stream.String() != "stream" || Wait.String() != "wait" || Kind(99).String() != "Kind(99)" {
		t.Error(Stream, Wait, Kind(99))
	}
}

// Next never panics, and what it asks for stays within the layouts it names.
func FuzzNext(f *testing.F) {
	f.Add(2, 1, 2, "draining", uint64(9), "outboxd_0of2,outboxd,outboxd_1of2", uint64(5))
	f.Add(1, 0, 0, "", uint64(0), "outboxd_0of4,outboxd_1of4,outboxd_2of4,outboxd_3of4", uint64(5))
	f.Add(4, 2, 4, "switched", uint64(9), "outboxd_0of4,outboxd_1of2", uint64(3))
	f.Fuzz(func(t *testing.T, want, from, to int, phase string, cutover uint64, slots string, confirmed uint64) {
		v := View{Slot: "outboxd", Publication: "outboxd", Want: want}
		if from != 0 || to != 0 {
			v.Plan = &Plan{From: from, To: to, Phase: Phase(phase), Cutover: pglogrepl.LSN(cutover)}
		}
		for i, s := range strings.Split(slots, ",") {
			v.Slots = append(v.Slots, Slot{Name: s, Confirmed: pglogrepl.LSN(confirmed + uint64(i)), Active: i%3 == 2})
			v.Publications = append(v.Publications, s)
		}
		a, err := Next(v)
		if err != nil {
			return
		}
		for _, s := range append(a.Shards, Shard{Index: 0, Count: 1}) {
			if s.Count < 1 || s.Index < 0 || s.Index >= s.Count {
				t.Fatalf("%+v: shard %+v", v, s)
			}
		}
		if a.Kind == Advance && a.Cutover == 0 {
			t.Fatalf("%+v: advance to 0", v)
		}
	})
}

// Issue 32 item 5: what a pipeline may do with the slot it has just taken,
// given the reshard recorded and whether it got the loop's lock.
func TestGateFor(t *testing.T) {
	const x = pglogrepl.LSN(0x500)
	draining := &Plan{From: 2, To: 4, Phase: Draining, Cutover: x}
	for _, tc := range []struct {
		name      string
		slot      string
		plan      *Plan
		locked    bool
		confirmed pglogrepl.LSN
		upto      pglogrepl.LSN
		wait      string
	}{
		{"steady", "outboxd_0of2", nil, true, 0x100, 0, ""},
		{"a loop runs", "outboxd_0of2", nil, false, 0x100, 0, "another outboxd is resharding"},
		{"creating: old slot held", "outboxd_0of2", &Plan{From: 2, To: 4, Phase: Creating}, true, 0x100, 0, ""},
		{"creating: the loop may record the cutover", "outboxd_0of2", &Plan{From: 2, To: 4, Phase: Creating}, false, 0x100, 0, "another outboxd is resharding"},
		{"creating: new slot", "outboxd_1of4", &Plan{From: 2, To: 4, Phase: Creating}, true, 0, 0, "is a new shard's"},
		{"draining: old slot up to X", "outboxd_1of2", draining, true, 0x100, x, ""},
		{"draining: old slot, loop running", "outboxd_1of2", draining, false, 0x100, x, ""},
		{"draining: old slot at X", "outboxd_1of2", draining, true, x, 0, "set postgres.shards: 4"},
		{"draining: the drain itself", "outboxd_1of2", draining, false, 0, x, ""},
		{"draining: new slot", "outboxd_3of4", draining, true, 0, 0, "is a new shard's"},
		{"switched: old slot at X", "outboxd_0of2", &Plan{From: 2, To: 4, Phase: Switched, Cutover: x}, true, x, 0, "has delivered every transaction up to the cutover"},
		{"rolling back: old slot", "outboxd_0of2", &Plan{From: 2, To: 4, Phase: RollingBack, Cutover: x}, true, 0x100, 0, ""},
		{"unsharded old slot", "outboxd", &Plan{From: 1, To: 2, Phase: Draining, Cutover: x}, true, 0x100, x, ""},
		{"not a shard name", "other", draining, false, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := GateFor("outboxd", tc.slot, tc.plan, tc.locked, tc.confirmed)
			if g.Upto != tc.upto || (tc.wait == "") != (g.Wait == "") || !strings.Contains(g.Wait, tc.wait) {
				t.Errorf("GateFor = %+v; want upto %s, wait %q", g, tc.upto, tc.wait)
			}
		})
	}
}
