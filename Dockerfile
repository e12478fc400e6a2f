# flctl with the exact versions of requirements.lock. Build: docker build -t flctl .
# Run:   docker run --gpus all -v $PWD/results:/work/results flctl run two-moons --method fl --eps 0.1 --device cuda
FROM python:3.11-slim-bookworm

# The real Fashion-MNIST images, which the fashion-mnist task reads from /usr/share/datasets/fashion-mnist.
RUN apt-get update && apt-get install -y --no-install-recommends dataset-fashion-mnist \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /work
COPY requirements.lock ./
# The locked versions (torch's CUDA wheels carry their CUDA libraries), then flctl itself without resolving again.
RUN pip install --no-cache-dir -r requirements.lock
COPY pyproject.toml README.md ./
COPY flctl ./flctl
COPY tasks ./tasks
COPY sweeps ./sweeps
RUN pip install --no-cache-dir --no-deps .
ENV FLCTL_RESULTS=/work/results
VOLUME ["/work/results"]
ENTRYPOINT ["flctl"]
CMD ["--help"]
