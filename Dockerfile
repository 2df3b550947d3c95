# The stagewright API image: `stagewright serve` on 0.0.0.0:8000.
#   docker build -t stagewright .
#   docker run -p 127.0.0.1:8000:8000 -v stagewright-data:/data stagewright
# Without STAGEWRIGHT_DATABASE_URL it keeps an embedded SQLite file in the /data volume;
# docker-compose.yml runs it against PostgreSQL instead. The executor (torch) is not in
# this image: the API plans, it does not train.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system stagewright \
    && useradd --system --gid stagewright --home-dir /app stagewright \
    && mkdir -p /data \
    && chown stagewright:stagewright /data

WORKDIR /app

# Dependencies first (their layer is reused while only the code changes): the project's
# requirements and its service extra, read from pyproject.toml. (The project itself cannot
# be built yet: pyproject.toml names every package folder, and they are copied below, with
# README.md, its long description, which changes far more often than the requirements.)
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['service']))" > requirements.txt \
    && pip install -r requirements.txt \
    && rm requirements.txt

# The code, the bundled profiles and the migrations. An editable install keeps `profiles/`
# and `migrations/` beside the packages, where the code looks for them.
COPY planner ./planner
COPY api ./api
COPY executor ./executor
COPY cli ./cli
COPY profiles ./profiles
COPY migrations ./migrations
COPY alembic.ini README.md ./
RUN pip install --no-deps -e . \
    && python -c "import api.app, cli.main, planner.search"

USER stagewright
ENV STAGEWRIGHT_DATABASE_URL=sqlite:////data/stagewright.db
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"

CMD ["stagewright", "serve", "--host", "0.0.0.0", "--port", "8000"]
