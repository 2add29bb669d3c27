// CoreDNS for the offline kind cluster (scripts/kind-up.sh), with only the
// plugins its Corefile uses (scripts/kind/coredns.yaml): no forward, no loop,
// no cloud backends. The directive order follows CoreDNS's plugin.cfg.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{
		"ready", "health", "errors", "log", "cache", "kubernetes",
	}
}

func main() { coremain.Run() }
