GO       ?= go
BIN      := bin/switchyard
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X 'main.Version=$(VERSION)'
TOOLBIN  := $(CURDIR)/.bin
PROTOS   := $(shell find proto -name '*.proto' -not -path 'proto/third_party/*')

.PHONY: build run test test-short bench proto tools verify clean

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/switchyard

tools:
	GOBIN=$(TOOLBIN) $(GO) install tool

proto: tools
	PATH=$(TOOLBIN):$$PATH protoc -I proto \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	  $(PROTOS)

clean:
	rm -rf bin .bin
