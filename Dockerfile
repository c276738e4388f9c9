# One image for every tunefarm process (api, tuner, worker); docker-compose.yml picks the command.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ libc6-dev curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tuner ./tuner
COPY workers ./workers
COPY api ./api
COPY schedules ./schedules
RUN pip install --no-cache-dir .
# every process runs as an unprivileged user that owns only its data directory
RUN useradd --system --user-group --uid 10001 --create-home --home-dir /home/tunefarm tunefarm \
    && mkdir -p /data && chown tunefarm:tunefarm /data
ENV TUNEFARM_DATA_DIR=/data PYTHONUNBUFFERED=1
USER tunefarm
ENTRYPOINT ["tunefarm"]
