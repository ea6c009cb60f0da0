// Command etcd is etcd's server (go.etcd.io/etcd/server/v3's etcdmain) for .ci/kube-up:
// Debian's etcd 3.4.23 reports no watch progress, which the API server needs to serve
// watch streams (KWOK's informers ask for them).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
