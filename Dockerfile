# The placement service: `docker build -t topoplace .` then `docker compose up`
# (docker-compose.yml adds Postgres and a few simulated agents).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . .
RUN pip install . \
    && rm -rf /src/build \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin topoplace \
    && install -d -o topoplace -m 0700 /var/lib/topoplace

# /var/lib/topoplace holds an agent's node key: a volume mounted there starts
# out owned by the agent's user. Run unprivileged, from a directory the user owns (the default SQLite file
# lands there when TOPOPLACE_DATABASE_URL is not set).
USER topoplace
WORKDIR /home/topoplace

ENV TOPOPLACE_HOST=0.0.0.0 \
    TOPOPLACE_PORT=8080 \
    TOPOPLACE_GRPC_PORT=50051
# REST (and the console) on 8080, gRPC on 50051.
EXPOSE 8080 50051

CMD ["topoplace", "serve"]
