-- A store written by wfsub at commit d8defd8 (before the SQLite layout was built from its numbered migrations),
-- by the workflows in tests/attack/test_attack_stores.py (OLD_FLOWS): o0 done, o1 cancelled, f1 failed, o2 and o3
-- waiting for 'approve', and an 'approve' for o3 queued in the inbox by the command while no Substrate ran.
PRAGMA application_id = 2003202914;
PRAGMA user_version = 1;
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE cases (
    case_order  INTEGER PRIMARY KEY AUTOINCREMENT,  -- `CaseRow.order`: assigned at insert, never reused
    case_id     TEXT NOT NULL UNIQUE,
    workflow    TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state       TEXT NOT NULL,
    started_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    ended_at    REAL,
    last_seq    INTEGER NOT NULL,
    next_due    REAL,
    live        INTEGER NOT NULL,  -- 1: initializing, running, waiting_effect, or effects in flight
    parked      INTEGER NOT NULL,  -- 1: waiting_signal or waiting_timer with no effect in flight
    detail      TEXT NOT NULL      -- JSON: at, signals, effects, timers, data, error, cancel_reason, suspended_reason
);
INSERT INTO cases VALUES(1,'o0','order','263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b','done',1795704493.5269804,1795704493.5613965988,1795704493.5612974166,3,NULL,0,0,'{"at":[],"signals":[],"effects":[],"timers":[],"data":{"n":0,"reserved":0,"charged":0,"lines":[{"packed":true},{"packed":true},{"packed":true}],"approve":{"by":"ann"},"shipped":"ann"},"error":null,"cancel_reason":null,"suspended_reason":null}');
INSERT INTO cases VALUES(2,'o1','order','263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b','cancelled',1795704493.5300874709,1795704493.5774159432,1795704493.5773246288,3,NULL,0,0,'{"at":[],"signals":[],"effects":[],"timers":[],"data":{"n":1,"reserved":1,"charged":10,"lines":[{"packed":true},{"packed":true},{"packed":true}]},"error":null,"cancel_reason":"customer asked","suspended_reason":null}');
INSERT INTO cases VALUES(3,'o2','order','263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b','waiting_signal',1795704493.5373725891,1795704493.5495197773,NULL,1,NULL,0,1,'{"at":["seq[2].wait"],"signals":["approve"],"effects":[],"timers":[],"data":{"n":2,"reserved":2,"charged":20,"lines":[{"packed":true},{"packed":true},{"packed":true}]},"error":null,"cancel_reason":null,"suspended_reason":null}');
INSERT INTO cases VALUES(5,'o3','order','263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b','waiting_signal',1795704493.5412549971,1795704493.553497076,NULL,1,NULL,0,1,'{"at":["seq[2].wait"],"signals":["approve"],"effects":[],"timers":[],"data":{"n":3,"reserved":3,"charged":30,"lines":[{"packed":true},{"packed":true},{"packed":true}]},"error":null,"cancel_reason":null,"suspended_reason":null}');
INSERT INTO cases VALUES(13,'f1','failing','e4b14a55d4d065b18ad13a24c99628ef4c14480b47dd1921ba847275840f1dba','failed',1795704493.5896246432,1795704493.5983741283,1795704493.5983490943,1,NULL,0,0,'{"at":[],"signals":[],"effects":[],"timers":[],"data":{"n":9,"reserved":9},"error":{"type":"ValueError","message":"task boom raised ValueError: no stock","path":"seq[1].task","traceback":"Traceback (most recent call last):\n  File \"/tmp/old/wfsub/_vm/_interp.py\", line 431, in run_general\n    res = arg(env)\n          ^^^^^^^^\n  File \"/tmp/a15/oldflows.py\", line 25, in boom\n    raise ValueError(\"no stock\")\nValueError: no stock\n","record":{"type":"ValueError","message":"task boom raised ValueError: no stock","path":"seq[1].task","compensated":[],"cause":null}},"cancel_reason":null,"suspended_reason":null}');
CREATE TABLE journal (
    case_id    TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    request_id TEXT,
    record     TEXT NOT NULL,
    PRIMARY KEY (case_id, seq)
) WITHOUT ROWID;
INSERT INTO journal VALUES('f1',0,'start',NULL,'{"seq":0,"kind":"start","case_id":"f1","workflow":"failing","fingerprint":"e4b14a55d4d065b18ad13a24c99628ef4c14480b47dd1921ba847275840f1dba","data":{"n":9},"scheduler":{"kind":"deterministic"},"deadline":null,"time":1795704493.5896246}');
INSERT INTO journal VALUES('f1',1,'end',NULL,'{"seq":1,"kind":"end","time":1795704493.598356,"outcome":"failed","digest":"72d5dfb4c0c492e6","error":{"type":"ValueError","message":"task boom raised ValueError: no stock","path":"seq[1].task","traceback":"Traceback (most recent call last):\n  File \"/tmp/old/wfsub/_vm/_interp.py\", line 431, in run_general\n    res = arg(env)\n          ^^^^^^^^\n  File \"/tmp/a15/oldflows.py\", line 25, in boom\n    raise ValueError(\"no stock\")\nValueError: no stock\n","record":{"type":"ValueError","message":"task boom raised ValueError: no stock","path":"seq[1].task","compensated":[],"cause":null}}}');
INSERT INTO journal VALUES('o0',0,'start',NULL,'{"seq":0,"kind":"start","case_id":"o0","workflow":"order","fingerprint":"263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b","data":{"n":0},"scheduler":{"kind":"deterministic"},"deadline":null,"time":1795704493.5269804}');
INSERT INTO journal VALUES('o0',1,'effect',NULL,'{"seq":1,"kind":"effect","step":4,"time":1795704493.530525,"digest":"8f4d4db2a259d981","effect_id":1,"path":"seq[0].saga[1].effect","name":"charge","result":{"charged":0}}');
INSERT INTO journal VALUES('o0',2,'signal','r-o0','{"seq":2,"kind":"signal","step":14,"time":1795704493.556008,"digest":"d268a987484bf6e9","name":"approve","payload":{"by":"ann"},"request_id":"r-o0"}');
INSERT INTO journal VALUES('o0',3,'end',NULL,'{"seq":3,"kind":"end","time":1795704493.5613868,"outcome":"done","digest":"3baa89049d59313c","result":{"n":0,"reserved":0,"charged":0,"lines":[{"packed":true},{"packed":true},{"packed":true}],"approve":{"by":"ann"},"shipped":"ann"}}');
INSERT INTO journal VALUES('o1',0,'start',NULL,'{"seq":0,"kind":"start","case_id":"o1","workflow":"order","fingerprint":"263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b","data":{"n":1},"scheduler":{"kind":"deterministic"},"deadline":null,"time":1795704493.5300875}');
INSERT INTO journal VALUES('o1',1,'effect',NULL,'{"seq":1,"kind":"effect","step":4,"time":1795704493.5383563,"digest":"6499bc154d412e5d","effect_id":1,"path":"seq[0].saga[1].effect","name":"charge","result":{"charged":10}}');
INSERT INTO journal VALUES('o1',2,'cancel',NULL,'{"seq":2,"kind":"cancel","step":14,"time":1795704493.5694075,"digest":"3e6bb4340b3bcb84","reason":"customer asked","compensate":true}');
INSERT INTO journal VALUES('o1',3,'end',NULL,'{"seq":3,"kind":"end","time":1795704493.5774033,"outcome":"cancelled","digest":"3e6bb4340b3bcb84","reason":"customer asked"}');
INSERT INTO journal VALUES('o2',0,'start',NULL,'{"seq":0,"kind":"start","case_id":"o2","workflow":"order","fingerprint":"263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b","data":{"n":2},"scheduler":{"kind":"deterministic"},"deadline":null,"time":1795704493.5373726}');
INSERT INTO journal VALUES('o2',1,'effect',NULL,'{"seq":1,"kind":"effect","step":4,"time":1795704493.5419378,"digest":"cab009d979d7f400","effect_id":1,"path":"seq[0].saga[1].effect","name":"charge","result":{"charged":20}}');
INSERT INTO journal VALUES('o3',0,'start',NULL,'{"seq":0,"kind":"start","case_id":"o3","workflow":"order","fingerprint":"263d18e1b997f8071b92c23fedb7e2bb7e7707b37526fb997868072450cbf32b","data":{"n":3},"scheduler":{"kind":"deterministic"},"deadline":null,"time":1795704493.541255}');
INSERT INTO journal VALUES('o3',1,'effect',NULL,'{"seq":1,"kind":"effect","step":4,"time":1795704493.5459876,"digest":"24de7d9ff98c4387","effect_id":1,"path":"seq[0].saga[1].effect","name":"charge","result":{"charged":30}}');
CREATE TABLE snapshots (
    case_id  TEXT NOT NULL,
    seq      INTEGER NOT NULL,  -- taken after the record `seq` was applied
    format   INTEGER NOT NULL,
    bytecode INTEGER NOT NULL,
    state    TEXT NOT NULL,     -- JSON: `Machine.snapshot()`
    PRIMARY KEY (case_id, seq)
) WITHOUT ROWID;
CREATE TABLE inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,  -- increasing, never reused: the inbox's order
    case_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,  -- JSON
    request_id TEXT,
    created_at REAL NOT NULL,
    refused    TEXT            -- why the owner refused it (the row stays, marked)
);
INSERT INTO inbox VALUES(1,'o3','signal','{"name":"approve","payload":{"by":"queued"}}','r-o3',1795704495.0676333904,NULL);
CREATE TABLE owner (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    owner_id  TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    host      TEXT NOT NULL,
    epoch     INTEGER NOT NULL,  -- 1 for the first owner, +1 at each new owner
    since     REAL NOT NULL,
    heartbeat REAL NOT NULL
);
INSERT INTO owner VALUES(1,'substrate-5b051000fbbb',23475,'vm',1,1795704493.5224595069,1795704493.5224595069);
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('cases',14);
INSERT INTO sqlite_sequence VALUES('inbox',1);
CREATE INDEX cases_by_state ON cases (state, case_order);
CREATE INDEX cases_by_workflow ON cases (workflow, case_order);
CREATE INDEX cases_live ON cases (case_order) WHERE live = 1;
CREATE INDEX cases_due ON cases (next_due) WHERE parked = 1 AND next_due IS NOT NULL;
CREATE INDEX cases_ended ON cases (ended_at) WHERE ended_at IS NOT NULL;
CREATE UNIQUE INDEX journal_request ON journal (case_id, request_id) WHERE request_id IS NOT NULL;
CREATE UNIQUE INDEX journal_one_end ON journal (case_id) WHERE kind = 'end';
CREATE INDEX inbox_pending ON inbox (id) WHERE refused IS NULL;
CREATE INDEX inbox_by_case ON inbox (case_id);
COMMIT;
