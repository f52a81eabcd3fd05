package ratelimit_test

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/dynamodb/dynamodbtest"
)

// One DynamoDB Local for the package's store tests, stopped at the end.
func TestMain(m *testing.M) { dynamodbtest.Main(m) }
