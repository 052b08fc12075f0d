"""Send-side provider adapters: SES, Twilio and the sandbox look-alikes (no database access)."""
