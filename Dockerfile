# flctl on a CUDA PyTorch base. Build: docker build -t flctl .
# Run:   docker run --gpus all -v $PWD/results:/work/results flctl run two-moons --method fl --eps 0.1 --device cuda
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

# The real Fashion-MNIST images (the fashion-mnist task reads them from /usr/share/datasets/fashion-mnist).
RUN apt-get update && apt-get install -y --no-install-recommends dataset-fashion-mnist \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /work
COPY pyproject.toml README.md ./
COPY flctl ./flctl
COPY tasks ./tasks
COPY sweeps ./sweeps
# The base image's torch satisfies the pin (torch>=2.4,<2.15), so pip keeps it and adds the rest.
RUN pip install --no-cache-dir '.[llm]'
ENV FLCTL_RESULTS=/work/results
VOLUME ["/work/results"]
ENTRYPOINT ["flctl"]
CMD ["--help"]
