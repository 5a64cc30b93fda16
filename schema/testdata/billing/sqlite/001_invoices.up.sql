CREATE TABLE invoices (
	id       INTEGER PRIMARY KEY,
	customer TEXT NOT NULL,
	cents    BIGINT NOT NULL
);
