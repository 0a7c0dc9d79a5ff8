"""The history store's schema: the ordered migrations `History.open` applies (`PRAGMA user_version` counts them).

Never edit a released entry; append a new one. Kept apart from `history.py` so that each stays short.
"""

from __future__ import annotations

# Each entry upgrades the schema by one version; never edit a released entry, append a new one.
MIGRATIONS: tuple[str, ...] = (
    # 1: runs, checks, figures.
    """
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        target TEXT NOT NULL,
        engine TEXT NOT NULL,
        combo TEXT,
        tiers TEXT NOT NULL,
        complete INTEGER NOT NULL,
        model TEXT NOT NULL,
        model_hash TEXT,
        fingerprint TEXT NOT NULL,
        platform TEXT NOT NULL,
        passed INTEGER NOT NULL, failed INTEGER NOT NULL, error INTEGER NOT NULL,
        skipped INTEGER NOT NULL, xfailed INTEGER NOT NULL, xpassed INTEGER NOT NULL
    );
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        id TEXT NOT NULL,
        tier TEXT NOT NULL,
        area TEXT NOT NULL,
        outcome TEXT NOT NULL,
        duration REAL NOT NULL,
        message TEXT NOT NULL,
        failure_class TEXT,
        bug_link TEXT,
        PRIMARY KEY (run_id, id)
    );
    CREATE TABLE figures (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        check_id TEXT NOT NULL,
        name TEXT NOT NULL,
        value REAL,
        PRIMARY KEY (run_id, check_id, name)
    );
    """,
    # 2: the lineage a run belongs to (trends and "what changed" follow it), the check's reference,
    #    where the run was read from, and indexes for the dashboard's queries.
    """
    ALTER TABLE runs ADD COLUMN lineage TEXT NOT NULL DEFAULT '';
    ALTER TABLE runs ADD COLUMN source TEXT;
    ALTER TABLE checks ADD COLUMN reference TEXT NOT NULL DEFAULT '';
    CREATE INDEX runs_by_lineage ON runs (lineage, started_at);
    CREATE INDEX figures_by_check ON figures (check_id, name);
    """,
    # 3: the run's phase timings (results.json `phases`: wall, floor, engine and server starts ...).
    """
    CREATE TABLE phases (
        run_id TEXT NOT NULL REFERENCES runs(run_id),
        name TEXT NOT NULL,
        seconds REAL NOT NULL,
        PRIMARY KEY (run_id, name)
    );
    """,
    # 4: the run's machine health verdict and its GPU telemetry series (results.json `machine_health`,
    #    `telemetry`), for the per-run telemetry plots.
    """
    CREATE TABLE run_health (
        run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
        verdict TEXT,
        telemetry TEXT NOT NULL
    );
    """,
    # 5: the engine under test joins the lineage ("cuda H200 · vllm · installed"): runs of the transformers engine
    #    and of vLLM on one platform are separate series, and parity compares vLLM with vLLM.
    """
    UPDATE runs SET lineage = substr(lineage, 1, instr(lineage, ' · ') - 1) || ' · ' || engine
        || substr(lineage, instr(lineage, ' · ')) WHERE instr(lineage, ' · ') > 0;
    """,
    # 6: why a run is no platform evidence (interrupted, refused, narrowed, a planted fault), NULL when it is;
    #    runs stored before are judged again from their files when they are ingested again.
    """
    ALTER TABLE runs ADD COLUMN not_evidence TEXT;
    UPDATE runs SET not_evidence = 'interrupted (complete: false)' WHERE complete = 0;
    """,
    # 7: the dashboard's lineage is keyed on what makes runs comparable: besides the platform, engine and combo
    #    (`lineage`, which the serving baselines key on), the model, the dtype and the serving profile; and the
    #    run's options that "what changed" diffs. Rows stored before hold none of these: `derived_by` < 7 marks
    #    them, and the next ingest reads them again from their run directory (which also judges again whether a
    #    complete run stored before schema 6, such as a refused one, is evidence). Until then their dtype is unknown.
    """
    ALTER TABLE runs ADD COLUMN dtype TEXT;
    ALTER TABLE runs ADD COLUMN profile TEXT;
    ALTER TABLE runs ADD COLUMN planted_fault TEXT;
    ALTER TABLE runs ADD COLUMN narrowed_by TEXT;
    ALTER TABLE runs ADD COLUMN exit_status INTEGER;
    ALTER TABLE runs ADD COLUMN derived_by INTEGER NOT NULL DEFAULT 6;
    CREATE INDEX runs_by_derivation ON runs (derived_by);
    """,
    # 8: a kept run reads as it was judged: each check's limits as its record carries them (JSON; NULL: the record
    #    carries none, written before results.json recorded them) and the suite that judged the run (version, commit,
    #    data hash; NULL: not recorded); and why the run's model is a test model (NULL: nothing says so), which caps
    #    its lineage below production-safe. Rows stored before are read again from their run directories
    #    (`derived_by` < 8), which fills these in and judges again whether each run is evidence.
    """
    ALTER TABLE checks ADD COLUMN limits TEXT;
    ALTER TABLE runs ADD COLUMN suite TEXT;
    ALTER TABLE runs ADD COLUMN test_model TEXT;
    """,
    # 9: a record whose checks do not add up to its own summary (cut short or edited) is no evidence. No column
    #    changes: rows stored before (`derived_by` < 9) are read again from their run directories and judged again.
    "",
)
SCHEMA_VERSION = len(MIGRATIONS)
