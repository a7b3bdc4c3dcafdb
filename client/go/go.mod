module github.com/tensorcheck/tensorcheck/client/go

go 1.19

require (
	github.com/golang/protobuf v1.4.1
	google.golang.org/grpc v1.33.3
)
