#!/bin/bash
# One Kafka node in KRaft mode (broker and controller in one JVM) for the compose Kafka override
# (deploy/local/docker-compose.kafka.yml): PLAINTEXT on the compose network (kafka:9092), EXTERNAL for the
# agent in the host's network (published on 127.0.0.1:KAFKA_EXTERNAL_PORT); writes server.properties from the environment, formats the
# data directory once (KAFKA_CLUSTER_ID), then runs the broker in the foreground (PID 1 under docker-init).
set -euo pipefail
: "${KAFKA_CLUSTER_ID:?set KAFKA_CLUSTER_ID (22 characters of base64url)}"
: "${KAFKA_ADVERTISED_HOST:=kafka}"
: "${KAFKA_EXTERNAL_PORT:=9092}"
: "${KAFKA_HEAP:=512m}"
data=/var/lib/kafka
props=$data/server.properties
cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,EXTERNAL://0.0.0.0:9094,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://${KAFKA_ADVERTISED_HOST}:9092,EXTERNAL://127.0.0.1:${KAFKA_EXTERNAL_PORT}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data/log
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
java=(java "-Xmx${KAFKA_HEAP}" "-Xms${KAFKA_HEAP}" -XX:+UseSerialGC -cp "/opt/kafka/libs/*")
if [ ! -f "$data/log/meta.properties" ]; then
    "${java[@]}" kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" -c "$props"
fi
exec "${java[@]}" kafka.Kafka "$props"
