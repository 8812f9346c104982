package orderevents

// The saga's events. Every one has the order id as its aggregate id, so the
// per-aggregate order of the outbox and the inbox (invariant I5) holds for
// each service's events about an order; each service has its own aggregate
// type, which the consumers subscribe to.
const (
	// InventoryAggregateType is the aggregate type of the inventory
	// consumer's events (StockReserved, StockRejected).
	InventoryAggregateType = "inventory"
	// PaymentAggregateType is the aggregate type of the payments
	// consumer's events (PaymentCaptured, PaymentFailed, PaymentRefunded,
	// RefundFailed, RefundUnknown).
	PaymentAggregateType = "payment"
	// Currency of every charge of the example.
	Currency = "eur"
)

// Saga event types.
const (
	// StockReserved: inventory reserved the order's items; payload
	// StockPayload.
	StockReserved = "StockReserved"
	// StockRejected: inventory could not reserve the order's items (not
	// enough on hand); nothing was reserved; payload StockPayload.
	StockRejected = "StockRejected"
	// PaymentCaptured: the provider charged the order; payload
	// PaymentPayload.
	PaymentCaptured = "PaymentCaptured"
	// PaymentFailed: the charge was declined, or not made because the order
	// was cancelled first; payload PaymentPayload.
	PaymentFailed = "PaymentFailed"
	// PaymentRefunded: the charge of a cancelled order was refunded;
	// payload PaymentPayload.
	PaymentRefunded = "PaymentRefunded"
	// RefundFailed: the provider refused the refund of a cancelled order's
	// charge for good (or an operator resolved the refund's call as
	// failed): a compensation that failed, for an operator; payload
	// PaymentPayload.
	RefundFailed = "RefundFailed"
	// RefundUnknown: the refund's outcome is still unknown after the
	// cancellation's last delivery (payments' RefundAttempts), or its call
	// is parked in the side-effect helper. The saga waits, parked with the
	// reason; payments keeps resolving the refund and records
	// PaymentRefunded or RefundFailed once it knows. Payload
	// PaymentPayload.
	RefundUnknown = "RefundUnknown"
)

// StockPayload is the payload of StockReserved and StockRejected.
type StockPayload struct {
	OrderID    string `json:"order_id"`
	Items      []Item `json:"items"`
	TotalCents int64  `json:"total_cents"`
	// Reason says why the stock was rejected.
	Reason string `json:"reason,omitempty"`
}

// PaymentPayload is the payload of the payments consumer's events.
type PaymentPayload struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	// ChargeID is the provider's charge id (empty when nothing was charged).
	ChargeID string `json:"charge_id,omitempty"`
	// RefundID is the provider's refund id (PaymentRefunded).
	RefundID string `json:"refund_id,omitempty"`
	// Reason says why the payment or the refund failed.
	Reason string `json:"reason,omitempty"`
}
