// Package orderevents defines the events of the example order system: the
// aggregate type, the event types and their JSON payloads, shared by the
// order API that writes them and the consumers that apply them.
package orderevents

import "time"

// AggregateType is the outbox aggregate type of every order event; the
// aggregate id is the order id.
const AggregateType = "order"

// Event types.
const (
	// OrderCreated is written when an order is placed; its payload is an
	// OrderCreated.
	OrderCreated = "OrderCreated"
	// OrderCancelled is written when an order is cancelled; its payload is an
	// OrderCancelled.
	OrderCancelled = "OrderCancelled"
)

// Item is one order line.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// OrderCreatedPayload is the payload of an OrderCreated event.
type OrderCreatedPayload struct {
	OrderID    string    `json:"order_id"`
	CustomerID string    `json:"customer_id"`
	Items      []Item    `json:"items"`
	CreatedAt  time.Time `json:"created_at"`
	// TotalCents is the order's amount in cents (the catalogue prices times
	// the quantities): what payments charges. Currency is "eur".
	TotalCents int64 `json:"total_cents,omitempty"`
}

// OrderCancelledPayload is the payload of an OrderCancelled event.
type OrderCancelledPayload struct {
	OrderID     string    `json:"order_id"`
	CustomerID  string    `json:"customer_id"`
	CancelledAt time.Time `json:"cancelled_at"`
	// Reason says why: "customer" for a cancellation through the API, or
	// the saga's reason ("stock rejected: ...", "payment failed: ...").
	Reason string `json:"reason,omitempty"`
}
