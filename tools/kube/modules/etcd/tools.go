//go:build tools

// etcd's main package is the root of its server module.
package tools

import _ "go.etcd.io/etcd/server/v3"
