# The kind "base" image of the offline node (scripts/kind/node.sh builds it; no
# registry): Debian bookworm from this machine's own base image, Debian's
# containerd/runc/CNI plugins instead of kind's source builds, and kind's
# images/base/files (entrypoint, systemd units, containerd config), copied by
# node.sh from sigs.k8s.io/kind in the Go module cache into kind-files/.
ARG BASE_IMAGE=openforge/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      systemd containerd runc containernetworking-plugins \
      iptables nftables conntrack iproute2 ethtool socat util-linux mount kmod \
      ca-certificates procps libseccomp2 pigz jq bash \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY kind-files/ /kind-files/
COPY files/ /openforge-files/
RUN set -e; f=/kind-files; o=/openforge-files; \
    install -m 0755 $f/usr/local/bin/entrypoint $f/usr/local/bin/clean-install /usr/local/bin/; \
    mkdir -p /kind/bin /kind/manifests /kind/openforge /etc/containerd /etc/kubernetes/manifests \
      /etc/systemd/system/kubelet.service.d /etc/cni/net.d /opt/cni; \
    install -m 0755 $f/kind/bin/* /kind/bin/; \
    install -m 0644 $f/etc/crictl.yaml /etc/; \
    install -m 0644 $f/etc/default/kubelet /etc/default/; \
    install -m 0644 $f/etc/sysctl.d/* /etc/sysctl.d/; \
    install -m 0644 $f/etc/systemd/system/*.service $f/etc/systemd/system/*.slice /etc/systemd/system/; \
    install -m 0644 $f/etc/systemd/system/kubelet.service.d/* /etc/systemd/system/kubelet.service.d/; \
    rm -f /etc/systemd/system/containerd-fuse-overlayfs.service; \
    install -m 0755 $o/openforge-entrypoint /usr/local/bin/; \
    install -m 0644 $o/containerd-config.toml /etc/containerd/config.toml; \
    install -m 0644 $o/cni.conflist /etc/cni/net.d/10-openforge.conflist; \
    install -m 0644 $o/default-storage.yaml /kind/manifests/; \
    ln -sfn /usr/lib/cni /opt/cni/bin; \
    ln -sf /usr/bin/containerd /usr/local/bin/containerd; \
    ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json; \
    rm -rf /kind-files /openforge-files
RUN find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* \
 && rm -f /etc/systemd/system/*.wants/* \
 && rm -f /lib/systemd/system/local-fs.target.wants/* \
 && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
 && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
 && rm -f /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service
ENV container=docker
CMD []
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/openforge-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]
