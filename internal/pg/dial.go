package pg

import (
	"net"
	"time"
)

// userTimeout bounds how long data sent to Postgres may stay unacknowledged
// before the kernel drops the connection (TCP_USER_TIMEOUT, on Linux). A
// Postgres host that vanishes without a reset (a crashed host, a failover
// that moves its address) otherwise keeps the replication connection open
// through about 15 minutes of retransmissions of outboxd's status updates,
// with the pipeline quiet and "streaming"; with it the read fails within a
// minute, and the pipeline restarts and connects again. It is far above
// postgres.status_interval, and a busy server still acknowledges what it has
// not read yet.
const userTimeout = 60 * time.Second

// dialer opens outboxd's TCP connections to Postgres.
func dialer() *net.Dialer { return &net.Dialer{Control: setUserTimeout} }
