// Package delivery holds the parts of a run's pipeline that need no
// supervisor: handing a record to the producer under the ack rule
// (Produce: registered with its transaction before it is handed over),
// building a poison row's dead letter (DeadLetter), reading a logical
// message's key (MessageKey), finding a batch's last commit (LastCommit),
// and exactly-once's driver (ExactlyOnce), which feeds an eos.Machine the
// stream and carries out its steps on a transactional producer.
//
// The caller (relay) owns the run: it registers every transaction with its
// checkpoint.Tracker in commit order, passes each record's done callback,
// and stops the run when Produce or a done callback returns an error.
package delivery
