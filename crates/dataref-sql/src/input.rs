//! The query's tables: batches already decoded, or a source that decodes only the columns
//! the plan reads, when the engine asks for them.

use std::fmt::Debug;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

/// Decodes a table's batches, only some columns of it when asked: a mapped Arrow file whose
/// unread columns are neither read nor validated.
pub trait Columns: Send + Sync + Debug {
    /// The batches with the columns of `projection` (schema indices, in its order), or all
    /// of them.
    fn batches(&self, projection: Option<&[usize]>) -> Result<Vec<RecordBatch>, ArrowError>;
}

/// One table of the query: its name in the SQL, its schema and its rows.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub schema: SchemaRef,
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Batches(Vec<RecordBatch>),
    Columns(Arc<dyn Columns>),
}

impl Input {
    /// A table of decoded batches.
    pub fn new(name: impl Into<String>, schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            name: name.into(),
            schema,
            source: Source::Batches(batches),
        }
    }

    /// A table decoded when the plan is made, only the columns the query reads.
    pub fn columns(name: impl Into<String>, schema: SchemaRef, source: Arc<dyn Columns>) -> Self {
        Self {
            name: name.into(),
            schema,
            source: Source::Columns(source),
        }
    }

    /// The engine's table. The schema's metadata is left behind (pandas writes its own on
    /// every table it makes): DataFusion merges the metadata of a join's or a union's
    /// inputs one way when it plans and another when it runs, and two inputs with
    /// different metadata failed as an engine fault (apache/datafusion#23434).
    pub(crate) fn into_table(self, partitions: usize) -> Arc<dyn TableProvider> {
        Arc::new(InputTable {
            schema: without_metadata(&self.schema),
            source: self.source,
            partitions: partitions.max(1),
        })
    }
}

/// An input as the engine sees it: scanned as memory, its batches spread over the
/// partitions so a scan uses every thread.
#[derive(Debug)]
struct InputTable {
    schema: SchemaRef,
    source: Source,
    partitions: usize,
}

#[async_trait]
impl TableProvider for InputTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let source = match &self.source {
            Source::Batches(batches) => MemorySourceConfig::try_new(
                &spread(restamp(batches.clone(), &self.schema)?, self.partitions),
                self.schema.clone(),
                projection.cloned(),
            )?,
            Source::Columns(columns) => {
                // Decoding faults pages in and may fetch a table's parts over the network:
                // other tasks of this runtime's thread move elsewhere meanwhile.
                let decode = || columns.batches(projection.map(Vec::as_slice));
                let on_many_threads = tokio::runtime::Handle::try_current().is_ok_and(|h| {
                    h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
                });
                let batches = if on_many_threads {
                    tokio::task::block_in_place(decode)
                } else {
                    decode()
                }
                .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))?;
                let schema = match projection {
                    Some(p) => Arc::new(self.schema.project(p)?),
                    None => self.schema.clone(),
                };
                let batches = restamp(batches, &schema)?;
                MemorySourceConfig::try_new(&spread(batches, self.partitions), schema, None)?
            }
        };
        Ok(DataSourceExec::from_data_source(source))
    }
}

fn without_metadata(schema: &SchemaRef) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().clone()))
}

/// `batches` under `schema` (the same columns, the schema's metadata left behind).
fn restamp(
    batches: Vec<RecordBatch>,
    schema: &SchemaRef,
) -> datafusion::error::Result<Vec<RecordBatch>> {
    batches
        .into_iter()
        .map(|b| {
            let rows = b.num_rows();
            RecordBatch::try_new_with_options(
                schema.clone(),
                b.columns().to_vec(),
                &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
            )
            .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))
        })
        .collect()
}

/// Batches dealt round-robin over `n` partitions; at least one partition, maybe empty.
fn spread(batches: Vec<RecordBatch>, n: usize) -> Vec<Vec<RecordBatch>> {
    let n = n.max(1);
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); n];
    for (i, b) in batches.into_iter().enumerate() {
        if let Some(p) = parts.get_mut(i % n) {
            p.push(b);
        }
    }
    parts.retain(|p| !p.is_empty());
    if parts.is_empty() {
        parts.push(Vec::new());
    }
    parts
}
