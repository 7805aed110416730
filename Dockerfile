# GPU image (default): CUDA 12 + cuDNN 9, which CTranslate2 4.5+ wheels link against.
# CPU-only image:  docker build --build-arg BASE_IMAGE=ubuntu:24.04 -t mediaserver:cpu .
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
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
    HF_HOME=/data/huggingface

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY mediaserver ./mediaserver
COPY static ./static
COPY tools ./tools
RUN pip install --upgrade pip && pip install -c requirements.lock .

# 19000 HTTPS (when /data/certs has cert.pem and key.pem: python tools/gen_cert.py --dir /data/certs),
# 19001 HTTP. WebRTC media will need a UDP range too (see README).
EXPOSE 19000 19001
VOLUME ["/data"]
CMD ["python", "-m", "mediaserver"]
