# The examples' image: the package with its demo extra, plus examples/.
# Used by docker-compose.yml (worker, beat, beat-worker and demo services).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package first, so editing an example does not reinstall the dependencies.
COPY pyproject.toml README.md ./
COPY celery_singleton_lock ./celery_singleton_lock
RUN pip install ".[demo]"

COPY examples ./examples

# Celery refuses to be comfortable as root; run as an ordinary user.
RUN useradd --create-home --uid 1000 app
USER app

CMD ["python", "-m", "examples.flash_sale.producer"]
