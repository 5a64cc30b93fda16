-- name: CreateTicket :one
INSERT INTO tickets (title, customer) VALUES (?, ?) RETURNING id, title, customer, status;

-- name: GetTicket :one
SELECT id, title, customer, status FROM tickets WHERE id = ?;

-- name: ListTickets :many
SELECT id, title, customer, status FROM tickets WHERE customer = ? ORDER BY id;

-- name: CloseTicket :exec
UPDATE tickets SET status = 'closed' WHERE id = ?;
