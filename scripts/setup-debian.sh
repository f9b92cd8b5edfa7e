#!/bin/sh
# Install what building and testing libdsm needs on Debian (12 or newer);
# iproute2 (ip, tc) and util-linux (unshare, nsenter) for the simulated nodes
# of `make check-multinode`; libopenblas-dev and python3-torch for the GPT example
# (examples/gpt) and its PyTorch reference; libtorch-dev for the PyTorch bridge
# (libdsm_torch, torch/), whose tests use python3-torch too; python3-matplotlib for the figures of doc/.
# Runs apt-get through sudo when not root. Installs nothing already present.
set -e
pkgs="build-essential gfortran autoconf automake libtool pkg-config
      libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools
      libhwloc-dev hwloc libcmocka-dev nlohmann-json3-dev python3 python3-venv clang cmake
      libopenblas-dev python3-torch libtorch-dev
      iproute2 procps util-linux python3-matplotlib"
missing=
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
echo "installing:$missing"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
