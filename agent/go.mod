module github.com/hoptrace/hoptrace/agent

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/vishvananda/netlink v1.3.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.23.0
	golang.org/x/sys v0.49.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
