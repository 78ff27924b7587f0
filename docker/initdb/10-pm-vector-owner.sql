-- pm_vector's owner role: no superuser (docs/operations.md, "Database roles"). The postgres image
-- runs this once, when it creates the data directory. The migrate service runs as the superuser
-- with PM_VECTOR_OWNER_ROLE=pm_vector_owner, which hands the schemas to this role; the api logs
-- in as it. Change the password (here and in compose.yaml) before using this beyond a laptop.
CREATE ROLE pm_vector_owner LOGIN PASSWORD 'pm_vector_owner'
  NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION;
