# The disagg-operator image: `disagg run` (Kopf operator + autoscaler).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator ./operator
# The tested versions (constraints.txt), not whatever is newest at build time.
RUN pip install -c constraints.txt . \
    && rm -rf /src \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot

WORKDIR /tmp
USER 65532:65532
# metrics, dashboard, liveness (/healthz)
EXPOSE 8080 8081 8082
ENTRYPOINT ["disagg"]
CMD ["run", "--bind", "0.0.0.0"]
