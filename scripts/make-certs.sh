#!/usr/bin/env bash
# Makes a local CA and the certificates the quickstart and the tests use (docs/tls.md), in DIR:
#   ca.pem ca.key              the local CA (10 years)
#   server.pem server.key      the server: 127.0.0.1, ::1 and localhost, signed by the CA
#   client.pem client.key      a client certificate for mutual TLS, signed by the CA
#   expired.pem expired.key    a server certificate for 127.0.0.1/localhost that expired in 2020
#   other-ca.pem other-ca.key  an unrelated CA (a client trusting it rejects server.pem)
#   other-server.pem/.key      a server certificate signed by the other CA
# Needs openssl (scripts/setup.sh installs it). Only for local use: keys are unencrypted.
set -euo pipefail
dir=${1:?usage: scripts/make-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
days=3650
quiet() { "$@" >/dev/null 2>&1 || { echo "make-certs: failed: $*" >&2; "$@"; exit 1; }; }

ca() { # name subject
  quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.pem" -days $days -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

leaf() { # name ca subject extensions [start end]
  local name=$1 issuer=$2 subject=$3 ext=$4
  quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$name.key" -out "$name.csr" -subj "/CN=$subject"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "$ext" >"$name.ext"
  if [ $# -ge 6 ]; then
    # A fixed validity window (for the expired certificate): `openssl x509 -req` cannot set
    # a start date, `openssl ca` can.
    mkdir -p "$name.db"
    : >"$name.db/index"
    printf '%s\n' "[ca]" "default_ca=own" "[own]" "database=$name.db/index" \
      "new_certs_dir=$name.db" "serial=$name.db/serial" "default_md=sha256" \
      "policy=any" "copy_extensions=none" "[any]" "commonName=supplied" >"$name.cnf"
    echo 01 >"$name.db/serial"
    quiet openssl ca -batch -config "$name.cnf" -cert "$issuer.pem" -keyfile "$issuer.key" \
      -in "$name.csr" -out "$name.pem" -startdate "$5" -enddate "$6" -extfile "$name.ext" -notext
    rm -rf "$name.db" "$name.cnf"
  else
    quiet openssl x509 -req -in "$name.csr" -CA "$issuer.pem" -CAkey "$issuer.key" \
      -CAcreateserial -out "$name.pem" -days $days -sha256 -extfile "$name.ext"
  fi
  rm -f "$name.csr" "$name.ext"
}

server_ext="subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth"
client_ext="keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

ca ca "ShardMQ local CA"
leaf server ca localhost "$server_ext"
leaf client ca shardmq-client "$client_ext"
leaf expired ca localhost "$server_ext" 20190101000000Z 20200101000000Z
ca other-ca "Another CA"
leaf other-server other-ca localhost "$server_ext"
rm -f ./*.srl
chmod 600 ./*.key
echo "made a CA and certificates in $dir"
