module github.com/hoptrace/hoptrace/agent

go 1.26
