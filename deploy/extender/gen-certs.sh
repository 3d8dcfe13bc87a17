#!/usr/bin/env bash
# The certificates that let only kube-scheduler call kgpu extender (deploy/extender/extender.yaml):
# a CA, the extender's serving certificate (the Service's DNS names, and any --ip), the client
# certificate kube-scheduler presents (CN kgpu-scheduler, extended key usage clientAuth), and the
# one a standby replica presents when it passes a bind on to the leader (CN kgpu-extender-peer,
# clientAuth), written as the two Secrets the manifests mount:
#   kgpu-extender-tls               tls.crt, tls.key (serving), client-ca.crt (the CA),
#                                   peer.crt, peer.key (the replicas' client certificate)
#   kgpu-scheduler-extender-client  tls.crt, tls.key (client), ca.crt (the CA)
#
#   gen-certs.sh [--out DIR] [--namespace NS] [--ip ADDRESS]... [--days N] [--apply]
#
# DIR (default ./kgpu-extender-certs) gets the PEM files and kgpu-extender-secrets.yaml; --apply
# applies that with kubectl. Keep ca.key offline. For the default kube-scheduler on the host
# network (kube-scheduler-config.yaml), copy DIR/client.crt, client.key and ca.crt to
# /etc/kubernetes/kgpu-extender-client/{tls.crt,tls.key,ca.crt} on each control-plane node.
# Renew before --days run out: run it again and restart both Deployments.
set -euo pipefail

out=./kgpu-extender-certs ns=kgpu-system days=365 apply=0
ips=()
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --namespace) ns=${2:?--namespace needs a name}; shift 2 ;;
    --ip) ips+=("${2:?--ip needs an address}"); shift 2 ;;
    --days) days=${2:?--days needs a number}; shift 2 ;;
    --apply) apply=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gen-certs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$days" in '' | *[!0-9]*) echo "gen-certs.sh: --days $days: not a number of days" >&2; exit 2 ;; esac
command -v openssl >/dev/null || { echo "gen-certs.sh: openssl not found (Debian: apt install openssl)" >&2; exit 1; }

mkdir -p "$out"
umask 077
cd "$out"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=kgpu-extender-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt

sign() {  # sign NAME CN EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days "$days" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
san="DNS:kgpu-extender.$ns.svc,DNS:kgpu-extender.$ns.svc.cluster.local,DNS:kgpu-extender.$ns,DNS:kgpu-extender"
for ip in "${ips[@]}"; do san+=",IP:$ip"; done
sign tls "kgpu-extender.$ns.svc" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san"
sign client kgpu-scheduler "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
sign peer kgpu-extender-peer "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

b64() { base64 -w0 <"$1"; }
cat >kgpu-extender-secrets.yaml <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: kgpu-extender-tls
  namespace: $ns
  labels: {app.kubernetes.io/name: kgpu-extender, app.kubernetes.io/part-of: kgpu}
type: Opaque
data:
  tls.crt: $(b64 tls.crt)
  tls.key: $(b64 tls.key)
  client-ca.crt: $(b64 ca.crt)
  peer.crt: $(b64 peer.crt)
  peer.key: $(b64 peer.key)
---
apiVersion: v1
kind: Secret
metadata:
  name: kgpu-scheduler-extender-client
  namespace: $ns
  labels: {app.kubernetes.io/name: kgpu-scheduler, app.kubernetes.io/part-of: kgpu}
type: Opaque
data:
  tls.crt: $(b64 client.crt)
  tls.key: $(b64 client.key)
  ca.crt: $(b64 ca.crt)
YAML
echo "gen-certs.sh: wrote $(pwd)/{ca,tls,client,peer}.{crt,key} and kgpu-extender-secrets.yaml (namespace $ns)"
if [ "$apply" = 1 ]; then
  kubectl apply -f kgpu-extender-secrets.yaml
fi
