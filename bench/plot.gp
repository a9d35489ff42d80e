# gnuplot -e "dir='bench/results'; size='small'; hascatchup=1; haslive=1" bench/plot.gp
# Catch-up throughput per workload and contender; live latency per rate.
set terminal pngcairo size 1100,520 font ",10" noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key outside right top
set grid ytics
set xtics rotate by -20

if (hascatchup) {
set output dir.'/catchup-'.size.'.png'
set title 'Catch-up throughput (events/s, first → last record appended; pg_recvlogical, pg_walread: decode only, start → exit)'
set ylabel 'events/s'
set logscale y
plot for [c in 'pg_recvlogical pg_walread kafka_raw outboxd outboxd_eos outboxd_b go_pq_cdc_kafka conduit debezium_default debezium_tuned'] \
  '< grep "\"'.c.'\"" '.dir.'/catchup.dat' using 3:xtic(1) title c
}

if (!haslive) exit
unset logscale y
set output dir.'/live-'.size.'.png'
set title 'Live: p99 commit → Kafka append latency (ms, log scale) by target rate (0/max = writers flat out)'
set ylabel 'p99 ms'
set logscale y
plot for [c in 'outboxd outboxd_eos outboxd_b go_pq_cdc_kafka conduit debezium_default debezium_tuned'] \
  '< grep "^\"'.c.'\"" '.dir.'/live.dat' using 4:xtic(2) title c
