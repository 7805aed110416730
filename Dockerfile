# syntax=docker/dockerfile:1.7
# (1.7 for ${BASE_IMAGE/-runtime-/-devel-} below: BuildKit, Docker 23 or later.)
# GPU image (default): CUDA 12 + cuDNN 9, which CTranslate2 4.5+ wheels link against.
# CPU-only image:  docker build --build-arg BASE_IMAGE=ubuntu:24.04 -t mediaserver:cpu .
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# llama.cpp's llama-server (the chat and embedding engines) and its shared libraries, from the
# llama.cpp that the pinned llama-cpp-python sdist vendors (tools/build_llama_cpp.py); the image
# needs no other llama.cpp build. On a CUDA base it is built in the matching devel image (nvcc, cuBLAS headers) with the CUDA backend for CUDA_ARCHITECTURES: 75 T4 and
# RTX 20xx, 80 A100/A30, 86 A10/A40 and RTX 30xx, 89 L4/L40S and RTX 40xx, 90 H100/H200 (compute_90
# PTX too, which newer GPUs JIT-compile at their first start); fewer build faster. Its CPU code, and
# the whole binary on the CPU image (no "-runtime-" in BASE_IMAGE: the same image), keep the portable flags.
FROM ${BASE_IMAGE/-runtime-/-devel-} AS llama-server
ARG LLAMA_CPP_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
ARG CUDA_ARCHITECTURES="75;80;86;89;90"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates build-essential cmake ninja-build \
 && python3 -m venv /opt/build
COPY requirements.lock tools/build_llama_cpp.py /src/
# CUDA_VERSION is set by every nvidia/cuda image, and only there.
RUN set -- ; if [ -n "${CUDA_VERSION:-}" ]; then set -- --cuda "$CUDA_ARCHITECTURES"; fi \
 && LLAMA_CPP_CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" /opt/build/bin/python /src/build_llama_cpp.py --server "$@" \
      --lock /src/requirements.lock --server-cache /llama-server-cache > /llama-server.path \
 && cp -a "$(dirname "$(cat /llama-server.path)")" /llama-server \
 && /opt/build/bin/python /src/build_llama_cpp.py --python-only-wheel --lock /src/requirements.lock \
      --wheelhouse /wheelhouse > /wheelhouse.path \
 && mkdir /wheels && cp "$(cat /wheelhouse.path)"/*.whl /wheels/

FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    MEDIASERVER_MODEL_CACHE_DIR=/data/models \
    MEDIASERVER_SAVE_AUDIO_DIR=/data/audio \
    MEDIASERVER_CERT_DIR=/data/certs \
    MEDIASERVER_TTS_VOICES_DIR=/data/voices \
    HF_HOME=/data/huggingface \
    MEDIASERVER_LLM_ENGINE_BINARY=/opt/llama-server/llama-server

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY mediaserver ./mediaserver
COPY static ./static
COPY tools ./tools
COPY --from=llama-server /llama-server /opt/llama-server
# llama-cpp-python's Python files only: the bundled model's package declares it; nothing imports it.
COPY --from=llama-server /wheels /wheels
# Every library llama-server links is here (its own beside it; libcudart and cuBLAS in the CUDA
# runtime image), but libcuda.so.1: the driver's, which the NVIDIA container runtime mounts at
# `docker run --gpus`.
RUN if ldd /opt/llama-server/llama-server | grep "not found" | grep -v "libcuda\.so\.1"; then \
      echo "llama-server misses the libraries above in this base image" >&2; exit 1; fi
RUN pip install --upgrade pip \
 && pip install -c requirements.lock --only-binary llama-cpp-python --find-links /wheels .
# The Smart Turn v3.2 end-of-turn model (BSD-2; its LICENSE lands beside it).
RUN python -m mediaserver.turns.fetch /opt/turn
ENV MEDIASERVER_TURN_MODEL_PATH=/opt/turn/smart-turn-v3.2-cpu.onnx

# 19000 HTTPS (when /data/certs has cert.pem and key.pem: python tools/gen_cert.py --dir /data/certs),
# 19001 HTTP, 10300 Wyoming. WebRTC media needs a UDP range too: rtc_udp_port_min/max (docs/webrtc.md).
EXPOSE 19000 19001 10300
VOLUME ["/data"]
CMD ["python", "-m", "mediaserver"]
