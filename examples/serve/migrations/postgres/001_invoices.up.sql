-- The invoices table: the id is the database's to assign, which the
-- handler reads back with RETURNING.
CREATE TABLE invoices (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL);
