-- An annotation database of oodbench before schema versions (PRAGMA user_version = 0), frozen as SQL.
-- Written by the code of main at 8ee09da (4 images, ann1/ann2/boss with the tests' password, a Stage 1
-- disagreement on image 1, a pending claim of ann1 on image 2, one label match). Never regenerate it.
BEGIN TRANSACTION;
CREATE TABLE assignments (
	id INTEGER NOT NULL, 
	image_id INTEGER NOT NULL, 
	user_id INTEGER NOT NULL, 
	slot INTEGER NOT NULL, 
	submitted BOOLEAN NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_assignment_slot UNIQUE (image_id, slot), 
	CONSTRAINT uq_assignment_user UNIQUE (user_id, image_id), 
	FOREIGN KEY(image_id) REFERENCES images (id), 
	FOREIGN KEY(user_id) REFERENCES users (id)
);
INSERT INTO "assignments" VALUES(1,1,1,0,1,'2026-12-01 05:56:08.996289');
INSERT INTO "assignments" VALUES(2,1,2,1,1,'2026-12-01 05:56:09.007777');
INSERT INTO "assignments" VALUES(3,2,1,0,0,'2026-12-01 05:56:09.037965');
CREATE TABLE events (
	id INTEGER NOT NULL, 
	image_id INTEGER NOT NULL, 
	user_id INTEGER NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	verdict VARCHAR(16), 
	label VARCHAR(256), 
	class_index INTEGER, 
	reason VARCHAR(32), 
	fine_grained BOOLEAN NOT NULL, 
	note VARCHAR(2000), 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(image_id) REFERENCES images (id), 
	FOREIGN KEY(user_id) REFERENCES users (id)
);
INSERT INTO "events" VALUES(1,1,1,'stage1','ood','snow globe',NULL,NULL,0,NULL,'2026-12-01 05:56:09.016947');
INSERT INTO "events" VALUES(2,1,2,'stage1','id',NULL,3,NULL,0,NULL,'2026-12-01 05:56:09.025323');
CREATE TABLE images (
	id INTEGER NOT NULL, 
	"key" VARCHAR(512) NOT NULL, 
	root VARCHAR(64) NOT NULL, 
	path VARCHAR(1024) NOT NULL, 
	original_label INTEGER, 
	flags JSON NOT NULL, 
	url VARCHAR(2048), 
	details JSON NOT NULL, 
	evidence JSON NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	n_assigned INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE ("key")
);
INSERT INTO "images" VALUES(1,'img000.png','images','sub0/img000.png',0,'["no-class"]',NULL,'{"row": {"path": "sub0/img000.png", "label": "0", "no_class": "1", "uncertain": "0"}}','{"vlm": {"absent": "no VLM embeddings given yet (oodbench annotate evidence PROJECT --image-embeddings \u2026)"}, "llm": {"absent": "no LLM description yet (oodbench annotate describe PROJECT)"}, "original": {"class": 0, "name": "class-0"}, "confusions": {"absent": "no re-annotation with original labels was imported"}, "reverse_search": {"absent": "no public URL is known for this image (set a public URL template in project.json)"}}','stage3',2,'2026-12-01 05:56:08.944141');
INSERT INTO "images" VALUES(2,'img001.png','images','sub1/img001.png',1,'["no-class", "uncertain"]',NULL,'{"row": {"path": "sub1/img001.png", "label": "1", "no_class": "1", "uncertain": "1"}}','{"vlm": {"absent": "no VLM embeddings given yet (oodbench annotate evidence PROJECT --image-embeddings \u2026)"}, "llm": {"absent": "no LLM description yet (oodbench annotate describe PROJECT)"}, "original": {"class": 1, "name": "class-1"}, "confusions": {"absent": "no re-annotation with original labels was imported"}, "reverse_search": {"absent": "no public URL is known for this image (set a public URL template in project.json)"}}','stage1',1,'2026-12-01 05:56:08.944148');
INSERT INTO "images" VALUES(3,'img002.png','images','sub0/img002.png',2,'["no-class"]',NULL,'{"row": {"path": "sub0/img002.png", "label": "2", "no_class": "1", "uncertain": "0"}}','{"vlm": {"absent": "no VLM embeddings given yet (oodbench annotate evidence PROJECT --image-embeddings \u2026)"}, "llm": {"absent": "no LLM description yet (oodbench annotate describe PROJECT)"}, "original": {"class": 2, "name": "class-2"}, "confusions": {"absent": "no re-annotation with original labels was imported"}, "reverse_search": {"absent": "no public URL is known for this image (set a public URL template in project.json)"}}','stage1',0,'2026-12-01 05:56:08.944149');
INSERT INTO "images" VALUES(4,'img003.png','images','sub1/img003.png',3,'["no-class", "uncertain"]',NULL,'{"row": {"path": "sub1/img003.png", "label": "3", "no_class": "1", "uncertain": "1"}}','{"vlm": {"absent": "no VLM embeddings given yet (oodbench annotate evidence PROJECT --image-embeddings \u2026)"}, "llm": {"absent": "no LLM description yet (oodbench annotate describe PROJECT)"}, "original": {"class": 3, "name": "class-3"}, "confusions": {"absent": "no re-annotation with original labels was imported"}, "reverse_search": {"absent": "no public URL is known for this image (set a public URL template in project.json)"}}','stage1',0,'2026-12-01 05:56:08.944150');
CREATE TABLE label_matches (
	id INTEGER NOT NULL, 
	label_a VARCHAR(256) NOT NULL, 
	label_b VARCHAR(256) NOT NULL, 
	user_id INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(user_id) REFERENCES users (id)
);
INSERT INTO "label_matches" VALUES(1,'snow globe','snowdome',3,'2026-12-01 05:56:09.043515');
CREATE TABLE sessions (
	token_hash VARCHAR(64) NOT NULL, 
	user_id INTEGER NOT NULL, 
	csrf_token VARCHAR(64) NOT NULL, 
	created_at DATETIME NOT NULL, 
	expires_at DATETIME NOT NULL, 
	PRIMARY KEY (token_hash), 
	FOREIGN KEY(user_id) REFERENCES users (id)
);
CREATE TABLE users (
	id INTEGER NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	password_hash VARCHAR(256) NOT NULL, 
	is_admin BOOLEAN NOT NULL, 
	active BOOLEAN NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (name)
);
INSERT INTO "users" VALUES(1,'ann1','$argon2id$v=19$m=1024,t=1,p=1$/2swff7J2gDTmiYjAbLoSg$bmUzER4r9D3tTppqnG1lsT90H6gdyQJTKT4nnIVYDTA',0,1,'2026-12-01 05:56:08.956310');
INSERT INTO "users" VALUES(2,'ann2','$argon2id$v=19$m=1024,t=1,p=1$sd710VBLU8RM2sK4nNXwcQ$gaynkqn9hu82peLpzlufWji6R1hm6AofW8dwaHt21BU',0,1,'2026-12-01 05:56:08.958274');
INSERT INTO "users" VALUES(3,'boss','$argon2id$v=19$m=1024,t=1,p=1$808JchTeAUnQ1vUZoxA4+A$7Sk9tJhhulp5iJ2+1y5fLJuuFo5GfQUilF9HC95Hr3A',1,1,'2026-12-01 05:56:08.967999');
CREATE INDEX ix_images_queue ON images (status, n_assigned, id);
CREATE INDEX ix_sessions_user_id ON sessions (user_id);
CREATE INDEX ix_events_image_id ON events (image_id);
CREATE INDEX ix_events_user_id ON events (user_id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'events is append-only'); END;
CREATE TRIGGER label_matches_no_update BEFORE UPDATE ON label_matches BEGIN SELECT RAISE(ABORT, 'label_matches is append-only'); END;
CREATE TRIGGER label_matches_no_delete BEFORE DELETE ON label_matches BEGIN SELECT RAISE(ABORT, 'label_matches is append-only'); END;
COMMIT;
