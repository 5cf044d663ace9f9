//! The registry: registration, schema compilation, argument validation naming the field.

use std::sync::Arc;

use hindsight::taxonomy::ErrorClass;
use hindsight::tools::{
    CallContext, RegistryError, Tool, ToolFuture, ToolOutput, ToolRegistry, ToolSpec,
};
use serde_json::{Value, json};

struct Echo(ToolSpec);

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn call<'a>(&'a self, args: Value, _ctx: &'a CallContext) -> ToolFuture<'a> {
        Box::pin(async move {
            Ok(ToolOutput {
                value: args,
                latency_ms: 0.0,
                cost: 0.0,
            })
        })
    }
}

fn echo(name: &str, schema: Value) -> Arc<dyn Tool> {
    let mut spec = ToolSpec::new(name, "echo");
    spec.input_schema = schema;
    Arc::new(Echo(spec))
}

#[tokio::test]
async fn registers_validates_and_calls() {
    let mut reg = ToolRegistry::new();
    let schema = json!({
        "type": "object",
        "properties": {"message": {"type": "string"}, "opts": {"type": "object", "properties": {"level": {"type": "integer", "minimum": 0}}}},
        "required": ["message"],
        "additionalProperties": false
    });
    reg.register(echo("echo", schema.clone())).unwrap();
    assert_eq!(
        reg.register(echo("echo", schema)),
        Err(RegistryError::Duplicate("echo".into()))
    );
    match reg.register(echo("bad", json!({"type": 12}))) {
        Err(RegistryError::BadSchema { tool, .. }) => assert_eq!(tool, "bad"),
        other => panic!("{other:?}"),
    }
    assert_eq!(reg.names(), ["echo"]);

    let ctx = CallContext::default();
    let out = reg
        .call("echo", json!({"message": "hi"}), &ctx)
        .await
        .unwrap();
    assert_eq!(out.value["message"], "hi");

    for (args, field) in [
        (json!({}), "/message"),
        (json!({"message": 3}), "/message"),
        (json!({"message": "x", "extra": 1}), "/extra"),
        (
            json!({"message": "x", "opts": {"level": -1}}),
            "/opts/level",
        ),
        (json!("text"), "(arguments)"),
    ] {
        let e = reg.validate("echo", &args).unwrap_err();
        assert_eq!(e.class, ErrorClass::SchemaMismatch);
        assert!(
            e.message.contains(&format!("field `{field}`")),
            "{field}: {}",
            e.message
        );
    }
    let e = reg.call("missing", json!({}), &ctx).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::NotFound);
}
