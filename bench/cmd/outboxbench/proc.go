package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// result is one benchmark run, printed as one JSON line.
type result struct {
	Date         string  `json:"date"`
	Label        string  `json:"label"`
	Workload     string  `json:"workload"`
	Mode         string  `json:"mode"`
	Events       int     `json:"events"`
	PayloadBytes int     `json:"payload_bytes"`
	StartupSec   float64 `json:"startup_s,omitempty"`     // process start → first record appended
	TotalSec     float64 `json:"total_s,omitempty"`       // process start → last record appended
	Throughput   float64 `json:"throughput,omitempty"`    // events/s, first → last record appended
	WallRate     float64 `json:"wall_rate,omitempty"`     // events/s, process start → last record
	CPUSeconds   float64 `json:"cpu_s"`                   // user+sys of the contender while it worked
	CPUPer100k   float64 `json:"cpu_s_per_100k"`          // CPU seconds per 100k events
	PeakRSSMB    float64 `json:"peak_rss_mb,omitempty"`   // VmHWM
	SteadyRSSMB  float64 `json:"steady_rss_mb,omitempty"` // median VmRSS while working
	SlotLagBytes int64   `json:"slot_lag_bytes"`
	TargetRate   float64 `json:"target_rate,omitempty"`
	WriteRate    float64 `json:"write_rate,omitempty"` // events/s the writers committed
	P50ms        float64 `json:"p50_ms,omitempty"`     // commit → visible to read_committed (LogAppendTime of the record or its commit marker)
	P99ms        float64 `json:"p99_ms,omitempty"`
	P999ms       float64 `json:"p999_ms,omitempty"`
	Maxms        float64 `json:"max_ms,omitempty"`
	// DrainSec is how long after the writers stopped the last event was in
	// Kafka (live runs; 0 when it was there before they stopped).
	DrainSec *float64 `json:"drain_s,omitempty"`
	Missing  int      `json:"missing,omitempty"` // events never seen in Kafka (catch-up: of the fill's seq numbers)
	// Repeated is how many records repeated an event already seen (live: by
	// its id, catch-up: by its seq); Verified says that Missing and
	// Repeated were counted (results from before the check have neither).
	Repeated int    `json:"repeated,omitempty"`
	Verified bool   `json:"verified,omitempty"`
	Load     string `json:"load"` // /proc/loadavg at start and end of the run
	// StealPct is the share of the machine's CPU time the hypervisor gave
	// to other guests during the run: on a shared VM, a slow hour shows here.
	StealPct *float64 `json:"steal_pct,omitempty"`
	// PGSendP99ms is the p99 of Postgres' share (live runs of outboxd):
	// commit → walsender send, from outboxd's histogram
	// outboxd_wal_commit_to_send_seconds over the run, interpolated within
	// its buckets as Prometheus' histogram_quantile does.
	PGSendP99ms *float64 `json:"pg_send_p99_ms,omitempty"`
	// BrokerCPUSec is the broker's CPU time during a live run: what the
	// contender's produce requests (and the measuring consumer) cost Kafka.
	BrokerCPUSec *float64 `json:"broker_cpu_s,omitempty"`
	// BesideP50ms, BesideP99ms and BesideMaxms are the floor measured beside
	// a live run (OUTBOXD_BENCH_BESIDE_RATE): a bare producer sending
	// BesideRate records/s to a topic of its own in the same seconds, on the
	// same broker and cores, timed as kafka_raw is (send → ack), or beside
	// an exactly-once contender as kafka_raw_eos is (send → commit marker).
	// Results from before the probe have none.
	BesideRate  float64 `json:"beside_rate,omitempty"`
	BesideTxn   bool    `json:"beside_txn,omitempty"`
	BesideP50ms float64 `json:"beside_p50_ms,omitempty"`
	BesideP99ms float64 `json:"beside_p99_ms,omitempty"`
	BesideMaxms float64 `json:"beside_max_ms,omitempty"`
	// Slots, Share and Rows describe a shards run: how many slots were read
	// in parallel, the share of the keys each one's row filter takes, and
	// the rows they sent together.
	Slots int     `json:"slots,omitempty"`
	Share float64 `json:"share,omitempty"`
	Rows  int     `json:"rows,omitempty"`
	Note  string  `json:"note,omitempty"`

	ticks0, steal0 int64 // /proc/stat at the start
}

func newResult(c common, mode string) *result {
	r := &result{Date: time.Now().UTC().Format(time.RFC3339), Label: c.label, Workload: c.workload, Mode: mode, Load: loadavg()}
	r.ticks0, r.steal0 = cpuTicks()
	return r
}

func (r *result) fillTimes(start, first, last time.Time) {
	r.StartupSec = first.Sub(start).Seconds()
	r.TotalSec = last.Sub(start).Seconds()
	if d := last.Sub(first).Seconds(); d > 0 {
		r.Throughput = float64(r.Events) / d
	}
	if r.TotalSec > 0 {
		r.WallRate = float64(r.Events) / r.TotalSec
	}
}

func (r *result) print() {
	r.Load += " → " + loadavg()
	if ticks, steal := cpuTicks(); ticks > r.ticks0 {
		pct := math.Round(1000*float64(steal-r.steal0)/float64(ticks-r.ticks0)) / 10
		r.StealPct = &pct
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// cpuTicks returns the machine's CPU time so far, all of it and the part
// stolen by the hypervisor, from the first line of /proc/stat.
func cpuTicks() (total, steal int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i := 1; i < len(f) && i <= 8; i++ {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		total += n
		if i == 8 {
			steal = n
		}
	}
	return total, steal
}

// proc is a contender process under observation.
type proc struct {
	cmd     *exec.Cmd
	start   time.Time
	exited  chan struct{}
	exitErr error

	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	rssOut  *os.File
}

type sample struct {
	at     time.Time
	rssKB  int64
	cpuSec float64
}

var clkTck = 100.0 // USER_HZ; 100 on every Linux we run on

func startProc(argv []string, logPath, rssPath string) (*proc, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no contender command after --")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), stop: make(chan struct{})}
	if rssPath != "" {
		f, err := os.Create(rssPath)
		if err != nil {
			return nil, err
		}
		p.rssOut = f
		fmt.Fprintln(f, "seconds rss_mb cpu_s")
	}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	go func() { p.exitErr = cmd.Wait(); close(p.exited) }()
	go p.sampleLoop()
	return p, nil
}

func (p *proc) sampleLoop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if s, ok := p.read(); ok {
			p.mu.Lock()
			p.samples = append(p.samples, s)
			p.mu.Unlock()
			if p.rssOut != nil {
				fmt.Fprintf(p.rssOut, "%.2f %.1f %.3f\n", s.at.Sub(p.start).Seconds(), float64(s.rssKB)/1024, s.cpuSec)
			}
		}
		select {
		case <-t.C:
		case <-p.stop:
			return
		case <-p.exited:
			return
		}
	}
}

// read samples RSS and CPU from /proc.
func (p *proc) read() (sample, bool) {
	pid := p.cmd.Process.Pid
	cpu, err := procCPU(pid)
	if err != nil {
		return sample{}, false
	}
	return sample{at: time.Now(), rssKB: statusKB(pid, "VmRSS:"), cpuSec: cpu}, true
}

// procCPU returns a process's user+system CPU seconds.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, err1 := strconv.ParseFloat(f[11], 64)
	k, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (u + k) / clkTck, nil
}

func statusKB(pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, key) {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return v
		}
	}
	return 0
}

func (p *proc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("contender exited early: %v (see its log)", p.exitErr)
	default:
		return nil
	}
}

// now samples immediately.
func (p *proc) now() sample {
	s, _ := p.read()
	return s
}

func (p *proc) peakRSSMB() float64 { return float64(statusKB(p.cmd.Process.Pid, "VmHWM:")) / 1024 }

// medianRSSMB is the median RSS of the samples taken in [from, to].
func (p *proc) medianRSSMB(from, to time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var v []int64
	for _, s := range p.samples {
		if !s.at.Before(from) && !s.at.After(to) {
			v = append(v, s.rssKB)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return float64(v[len(v)/2]) / 1024
}

// terminate sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) terminate(grace time.Duration) {
	close(p.stop)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	if p.rssOut != nil {
		_ = p.rssOut.Close()
	}
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}
