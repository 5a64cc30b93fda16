-- name: CreateTicket :one
INSERT INTO tickets (title, customer) VALUES ($1, $2) RETURNING id, title, customer, status;

-- name: GetTicket :one
SELECT id, title, customer, status FROM tickets WHERE id = $1;

-- name: ListTickets :many
SELECT id, title, customer, status FROM tickets WHERE customer = $1 ORDER BY id;

-- name: CloseTicket :exec
UPDATE tickets SET status = 'closed' WHERE id = $1;
