# Sourced after ALIBI_CACHE is set: the pins of the carried kernel libraries (issue 26, docs/digests.md
# "The kernel cache"). `alibi kernels build` on the CPU machine pins each library's build key and sha256
# in that machine's config folder (~/.config/alibi/kernel-pins.json); carry that file as
# gpu_payload/kernel-pins.json with gpu_payload/alibi_cache.tar.xz and the carried libraries load
# verified. Without it they load only under ALIBI_ACCEPT_UNPINNED_KERNELS=1, which each kernel's
# evidence (report, manifest) then records as `verified: false`; libraries built here are pinned here.
if [ -f gpu_payload/kernel-pins.json ]; then
  mkdir -p -m 700 "$W/alibi_config" && cp gpu_payload/kernel-pins.json "$W/alibi_config/kernel-pins.json" \
    && chmod 600 "$W/alibi_config/kernel-pins.json"
  export ALIBI_CONFIG=$W/alibi_config
  echo "kernel pins: gpu_payload/kernel-pins.json ($(grep -c '"sha256"' "$W/alibi_config/kernel-pins.json") libraries)"
else
  export ALIBI_ACCEPT_UNPINNED_KERNELS=1
  echo "kernel pins: none carried (gpu_payload/kernel-pins.json); carried libraries load unverified, and say so"
fi
