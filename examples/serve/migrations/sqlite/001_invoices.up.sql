-- The invoices table: the id is the database's to assign, which the
-- handler reads back with RETURNING.
CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer TEXT NOT NULL);
