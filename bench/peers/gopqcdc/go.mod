module github.com/outboxd/outboxd/bench/peers/gopqcdc

go 1.25.0

require (
	github.com/Trendyol/go-pq-cdc v1.10.12
	github.com/Trendyol/go-pq-cdc-kafka v1.3.1
	github.com/segmentio/kafka-go v0.4.51
)
