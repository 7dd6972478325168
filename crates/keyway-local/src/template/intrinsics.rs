//! What a template's values resolve to: parameters, `!Ref`, `!GetAtt`, `!Sub`, `Fn::Join`, read
//! in either form, and CloudFormation's long form of a value, in which templates compare.

use super::*;

/// Resolves nothing but parameters and pseudo parameters.
pub(super) struct ParametersOnly;

impl Resolver for ParametersOnly {
    fn reference(&self, _: &str) -> Option<String> {
        None
    }
    fn attribute(&self, _: &str, _: &str) -> Option<String> {
        None
    }
}

/// A template's value as JSON with its short tags written out as CloudFormation's long form
/// (`!Ref X` as `{"Ref": "X"}`, `!GetAtt X.Y` as `{"Fn::GetAtt": ["X", "Y"]}`, `!Sub`,
/// `!Equals` and the other functions as `{"Fn::<name>": ...}`): a template written by hand and
/// one the CDK synthesizes compare equal when they say the same.
pub fn long_form(value: &Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Number(n) => serde_json::to_value(n).unwrap_or(Json::Null),
        Value::String(s) => Json::String(s.clone()),
        Value::Sequence(items) => Json::Array(items.iter().map(long_form).collect()),
        Value::Mapping(m) => Json::Object(
            m.iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), long_form(v)))
                .collect(),
        ),
        Value::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let name = tag.trim_start_matches('!');
            let inner = long_form(&tagged.value);
            match (name, inner) {
                ("Ref", inner) => serde_json::json!({ "Ref": inner }),
                ("GetAtt", Json::String(path)) => {
                    let parts: Vec<&str> = path.splitn(2, '.').collect();
                    serde_json::json!({ "Fn::GetAtt": parts })
                }
                (name, inner) => serde_json::json!({ format!("Fn::{name}"): inner }),
            }
        }
    }
}

/// A mapping's properties with each one that is a parameter (`!Ref P`, `{Ref: P}`) given the
/// parameter's value, as CloudFormation passes it: a setting made a parameter is read, not
/// passed over.
pub(super) fn with_parameters(p: &Value, template: &Value) -> Value {
    let Some(properties) = p.as_mapping() else {
        return p.clone();
    };
    let parameter = |value: &Value| {
        let name = match value {
            Value::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str()?,
            Value::Mapping(m) if m.len() == 1 => m.get("Ref")?.as_str()?,
            _ => return None,
        };
        let text = scalar(get(get(get(template, "Parameters")?, name)?, "Default")?);
        Some(match text.parse::<i64>() {
            Ok(n) => Value::Number(n.into()),
            Err(_) => Value::String(text),
        })
    };
    let resolved = properties
        .iter()
        .map(|(k, v)| (k.clone(), parameter(v).unwrap_or_else(|| v.clone())))
        .collect();
    Value::Mapping(resolved)
}

/// The logical id a `!GetAtt X.Attr`, `!Ref X` or their long forms point at.
pub(super) fn logical_id(value: &Value) -> Option<String> {
    match value {
        Value::Tagged(tagged) => {
            let inner = tagged.value.as_str()?;
            Some(inner.split('.').next().unwrap_or(inner).to_owned())
        }
        Value::Mapping(m) => {
            if let Some(r) = m.get("Ref").and_then(Value::as_str) {
                return Some(r.to_owned());
            }
            match m.get("Fn::GetAtt")? {
                Value::Sequence(parts) => parts.first()?.as_str().map(str::to_owned),
                Value::String(s) => Some(s.split('.').next().unwrap_or(s).to_owned()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Resolves a value as CloudFormation would: references, attributes, substitutions, parameters.
pub fn resolve(
    value: &Value,
    template: &Value,
    resolver: &dyn Resolver,
) -> Result<String, TemplateError> {
    let intrinsics = Intrinsics { template, resolver };
    match value {
        Value::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let inner = tagged
                .value
                .as_str()
                .ok_or_else(|| TemplateError::at(&tag, "expected a string"))?;
            match tag.as_str() {
                "!Ref" => intrinsics.reference(inner),
                "!GetAtt" => intrinsics.attribute(inner),
                "!Sub" => intrinsics.substitute(inner),
                other => err_at(other, "not supported here"),
            }
        }
        Value::Mapping(m) => intrinsics.function(m, value),
        other => Ok(scalar(other)),
    }
}

/// The intrinsic functions of one template, resolving names through `resolver`.
struct Intrinsics<'a> {
    template: &'a Value,
    resolver: &'a dyn Resolver,
}

impl Intrinsics<'_> {
    fn parameter(&self, name: &str) -> Option<String> {
        get(self.template, "Parameters")
            .and_then(|p| get(p, name))
            .and_then(|p| get(p, "Default"))
            .map(scalar)
    }

    /// `!Ref name`: a pseudo parameter, a resource or a parameter.
    fn reference(&self, name: &str) -> Result<String, TemplateError> {
        match name {
            "AWS::Region" => Ok("us-east-1".into()),
            "AWS::AccountId" => Ok("000000000000".into()),
            "AWS::StackName" => Ok("keyway-local".into()),
            "AWS::Partition" => Ok("aws".into()),
            _ => self
                .resolver
                .reference(name)
                .or_else(|| self.parameter(name))
                .ok_or_else(|| {
                    TemplateError::at(format!("!Ref {name}"), "no such resource or parameter")
                }),
        }
    }

    /// `!GetAtt Resource.Attribute`.
    fn attribute(&self, path: &str) -> Result<String, TemplateError> {
        let (id, attr) = path.split_once('.').ok_or_else(|| {
            TemplateError::at(format!("!GetAtt {path}"), "expected Resource.Attribute")
        })?;
        self.resolver
            .attribute(id, attr)
            .ok_or_else(|| TemplateError::at(format!("!GetAtt {path}"), "unknown"))
    }

    /// `!Sub text`: each `${name}` a reference, each `${Resource.Attribute}` an attribute.
    fn substitute(&self, text: &str) -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .ok_or_else(|| TemplateError::at(format!("!Sub {text:?}"), "unclosed ${"))?
                + start;
            let name = &rest[start + 2..end];
            out.push_str(&if name.contains('.') && !name.starts_with("AWS::") {
                self.attribute(name)?
            } else {
                self.reference(name)?
            });
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// An intrinsic function in its long form (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::Join`).
    fn function(&self, m: &serde_yaml::Mapping, value: &Value) -> Result<String, TemplateError> {
        if let Some(name) = m.get("Ref").and_then(Value::as_str) {
            self.reference(name)
        } else if let Some(v) = m.get("Fn::GetAtt") {
            match v {
                Value::Sequence(parts) => self.attribute(
                    &parts
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("."),
                ),
                other => self.attribute(other.as_str().unwrap_or_default()),
            }
        } else if let Some(text) = m.get("Fn::Sub").and_then(Value::as_str) {
            self.substitute(text)
        } else if let Some(join) = m.get("Fn::Join") {
            // [delimiter, [values...]], as the CDK writes string interpolations.
            let parts = join.as_sequence().filter(|p| p.len() == 2);
            let (delimiter, values) = match parts.map(|p| (p[0].as_str(), p[1].as_sequence())) {
                Some((Some(d), Some(v))) => (d, v),
                _ => return err_at("Fn::Join", "expected [delimiter, [values]]"),
            };
            Ok(values
                .iter()
                .map(|v| resolve(v, self.template, self.resolver))
                .collect::<Result<Vec<_>, _>>()?
                .join(delimiter))
        } else {
            Err(TemplateError::whole(format!("unsupported value {value:?}")))
        }
    }
}

/// The template's `Outputs`, each value resolved. A resource the runtime does not make (an IAM
/// policy) is named by its logical id: nothing the runtime runs can use it.
pub fn outputs(
    template: &Value,
    resolver: &dyn Resolver,
) -> Result<BTreeMap<String, String>, TemplateError> {
    struct Declared<'a> {
        made: &'a dyn Resolver,
        resources: Option<&'a Value>,
    }
    impl Resolver for Declared<'_> {
        fn reference(&self, id: &str) -> Option<String> {
            self.made.reference(id).or_else(|| {
                self.resources
                    .and_then(|r| get(r, id))
                    .map(|_| id.to_owned())
            })
        }
        fn attribute(&self, id: &str, attribute: &str) -> Option<String> {
            self.made.attribute(id, attribute)
        }
    }
    let resolver = &Declared {
        made: resolver,
        resources: get(template, "Resources"),
    };
    let outputs = get(template, "Outputs").and_then(Value::as_mapping);
    outputs
        .into_iter()
        .flatten()
        .map(|(name, output)| {
            let name = name.as_str().unwrap_or_default().to_owned();
            let value = get(output, "Value")
                .ok_or_else(|| TemplateError::at(format!("Outputs.{name}"), "no Value"))?;
            let resolved = resolve(value, template, resolver)
                .map_err(|e| e.through(format!("Outputs.{name}")))?;
            Ok((name, resolved))
        })
        .collect()
}

/// A whole number written in the template: literally, as text, or as `!Ref` of a parameter.
pub(super) fn whole_number(value: &Value, template: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => {
            let parameter = logical_id(value)?;
            let default = get(template, "Parameters")
                .and_then(|p| get(p, &parameter))
                .and_then(|p| get(p, "Default"))?;
            scalar(default).parse().ok()
        }
    }
}

pub(super) fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

impl FunctionDef {
    /// The function's environment with every reference resolved, as Lambda would see it.
    pub fn resolved_env(
        &self,
        template: &Value,
        resolver: &dyn Resolver,
    ) -> Result<Env, TemplateError> {
        self.env
            .iter()
            .map(|(name, raw)| {
                let value: Value = serde_yaml::from_str(raw)
                    .map_err(|e| TemplateError::at(format!("{}.{name}", self.logical_id), e))?;
                let resolved = resolve(&value, template, resolver)
                    .map_err(|e| e.through(format!("{}.{name}", self.logical_id)))?;
                Ok((name.clone(), resolved))
            })
            .collect()
    }
}
